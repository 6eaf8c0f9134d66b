//! Worker.
pub struct Worker; pub struct WorkerBuilder; pub enum WorkerEvent{} pub struct WorkerStats;
