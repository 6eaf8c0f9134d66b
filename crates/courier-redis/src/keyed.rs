//! A keyed queue (`concurrency_max`, `fair`): messages wait in a list per concurrency key, and
//! one Lua script per operation takes, renews and frees the keys' slots as delivery leases.
//! The layout is described in `lua/keyed.lua`.

use courier_core::KeyPath;

/// What a keyed queue needs beside the transport's options.
#[derive(Debug)]
pub(crate) struct Keyed {
    /// `<stream>:keyed:`, the prefix of every key of the queue.
    pub(crate) prefix: String,
    /// The most messages of one key delivered at once; 0 for no limit.
    pub(crate) max: u32,
    pub(crate) fair: bool,
    pub(crate) path: Option<KeyPath>,
}

impl Keyed {
    pub(crate) fn new(options: &crate::RedisOptions) -> Option<Self> {
        options.is_keyed().then(|| Self {
            prefix: options.keyed_prefix(),
            max: options.concurrency_max.unwrap_or(0),
            fair: options.fair,
            path: options.concurrency_key.clone(),
        })
    }

    /// The queue's signal stream, where waiting consumers block.
    pub(crate) fn signal_key(&self) -> String {
        format!("{}signal", self.prefix)
    }
}
