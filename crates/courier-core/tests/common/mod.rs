//! What the worker tests share: a job message and an in-memory queue holding some.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use courier_core::{Envelope, InMemoryTransport, Message, Transport};
use serde::{Deserialize, Serialize};

/// A job carrying its number.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Job(pub u32);
impl Message for Job {
    const NAME: &'static str = "test.job";
}

/// An in-memory queue holding jobs `0..n`.
pub async fn queue_with(n: u32) -> Arc<InMemoryTransport> {
    let q = Arc::new(InMemoryTransport::new());
    for i in 0..n {
        q.send(Envelope::new(Job(i)))
            .await
            .expect("the in-memory queue takes every job");
    }
    q
}
