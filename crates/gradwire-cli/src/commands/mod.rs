//! What `train` and `compare` print of the runs the `gradwire_experiments`
//! library makes of their flags: progress bars (`crate::console`), tables
//! or JSON, and the comparison's plots and reports. (`bench`, `faults` and
//! `project` print their own tables.)

pub(crate) mod compare;
pub(crate) mod train;
