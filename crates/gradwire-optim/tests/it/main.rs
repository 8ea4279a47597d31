//! gradwire-optim's integration tests, gathered into one test binary (one link
//! instead of one per file): each module is the file it was.

mod accumulate;
mod any_optimizer;
mod bucket_order;
mod checkpoint;
mod checkpoint_fixture;
mod common;
mod diloco;
mod dimreduce;
mod distopt;
mod grad_sync;
mod grad_sync_local;
mod join;
mod onebit_adam;
mod optimizers;
mod reshard;
mod stateful_strategies;
mod straggler;
mod streaming;
mod trajectory;
