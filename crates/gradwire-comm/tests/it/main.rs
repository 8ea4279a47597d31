//! gradwire-comm's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod collectives;
mod faults;
mod flight;
mod timeline;
