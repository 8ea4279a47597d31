//! Cross-crate tests of gradwire.
//!
//! It holds the tests that look at more than one crate at a time, in `tests/`;
//! the digits data set and the MLP they train come from `gradwire-cli`.
//!
//! - `tidy.rs`: repository hygiene checks over every workspace member (every
//!   crate root denies `missing_docs`, every source file starts with a `//!`
//!   module doc).
//! - `convergence.rs`: data-parallel training of the digits MLP on 4 ranks:
//!   dense averaging and AdaSum by delta weight against one worker.
//!
//! Later: the conformance suite run against every `Communicator` backend.

#![deny(missing_docs)]
