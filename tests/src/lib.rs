//! Cross-crate tests of gradwire.
//!
//! It holds the tests that look at more than one crate at a time, in `tests/`,
//! and what they share: [`digits`], a small classifier on smartcore's digits
//! data set for end-to-end runs.
//!
//! - `tidy.rs`: repository hygiene checks over every workspace member (every
//!   crate root denies `missing_docs`, every source file starts with a `//!`
//!   module doc).
//! - `convergence.rs`: data-parallel training of the digits MLP on 4 ranks:
//!   dense averaging and AdaSum by delta weight against one worker.
//!
//! Later: the conformance suite run against every `Communicator` backend.

#![deny(missing_docs)]

pub mod digits;
