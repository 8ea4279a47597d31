//! Cross-crate tests of gradwire.
//!
//! This crate has no library API of its own: it holds the tests that look at
//! more than one crate at a time, in `tests/`:
//!
//! - `tidy.rs`: repository hygiene checks over every workspace member (every
//!   crate root denies `missing_docs`, every source file starts with a `//!`
//!   module doc).
//!
//! Later: the conformance suite run against every `Communicator` backend
//! available, cross-crate property tests, and end-to-end convergence runs.

#![deny(missing_docs)]
