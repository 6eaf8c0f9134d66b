//! Where a scenario's messages, runs and failures live (its DSNs), and the configuration its
//! workers read.

use std::path::Path;

use super::{Plan, Target, humantime};
use crate::poison::Storage;
use crate::server::Server;

/// The DSNs and storages of one scenario.
pub(super) struct Layout {
    pub(super) dsn: String,
    pub(super) failed_dsn: String,
    pub(super) store: String,
    pub(super) options: bool,
    pub(super) poison: Storage,
    pub(super) failed: Storage,
}

pub(super) fn layout(target: Target, dir: &Path, server: Option<&Server>, plan: &Plan) -> Layout {
    let sqlite = |file: &str| format!("sqlite://{}", dir.join(file).display());
    let runs = format!("{}?mode=rwc", sqlite("runs.db"));
    let base = server.map(Server::dsn).unwrap_or_default();
    match target {
        Target::Sqlite => Layout {
            dsn: format!("{}?mode=rwc", sqlite("messages.db")),
            failed_dsn: format!("{}?mode=rwc&queue_name=failed", sqlite("messages.db")),
            store: runs,
            options: true,
            poison: Storage::Sql {
                url: sqlite("messages.db"),
            },
            failed: Storage::Sql {
                url: sqlite("messages.db"),
            },
        },
        Target::Postgres | Target::Mariadb => Layout {
            dsn: base.clone(),
            failed_dsn: format!("{base}?queue_name=failed"),
            store: base.clone(),
            options: true,
            poison: Storage::Sql { url: base.clone() },
            failed: Storage::Sql { url: base },
        },
        Target::Redis => Layout {
            dsn: format!("{base}?stream=chaos"),
            failed_dsn: format!("{base}?stream=failed"),
            store: runs,
            options: true,
            poison: Storage::Redis {
                url: base.clone(),
                stream: "chaos".into(),
            },
            failed: Storage::Redis {
                url: base,
                stream: "failed".into(),
            },
        },
        // The redelivery window is JetStream's ack_wait, set in the DSN (the transport has no
        // `redeliver_timeout`); the failure transport is SQLite, as for RabbitMQ.
        Target::Nats => Layout {
            dsn: format!("{base}/chaos?ack_wait={}", humantime(plan.redeliver)),
            failed_dsn: format!("{}?mode=rwc&queue_name=failed", sqlite("failed.db")),
            store: runs,
            options: false,
            poison: Storage::Nats {
                url: base,
                subject: "chaos.messages".into(),
            },
            failed: Storage::Sql {
                url: sqlite("failed.db"),
            },
        },
        Target::Rabbitmq => Layout {
            dsn: base.clone(),
            failed_dsn: format!("{}?mode=rwc&queue_name=failed", sqlite("failed.db")),
            store: runs,
            options: false,
            poison: Storage::Amqp {
                url: base,
                queue: "async".into(),
            },
            failed: Storage::Sql {
                url: sqlite("failed.db"),
            },
        },
    }
}

pub(super) fn config_text(layout: &Layout, plan: &Plan) -> String {
    let options = if layout.options {
        format!(
            "options = {{ redeliver_timeout = \"{}\" }}\n",
            humantime(plan.redeliver)
        )
    } else {
        String::new()
    };
    format!(
        r#"[transports.async]
dsn = "{dsn}"
failure_transport = "failed"
retry = {{ max_retries = 3, delay = "200ms", multiplier = 2.0 }}
{options}
[transports.failed]
dsn = "{failed}"

[routing]
"chaos.item" = "async"
"courier.run_agent" = "async"

[runs]
store = "{store}"
lease = "{lease}"
reap_every = "{reap}"
"#,
        dsn = layout.dsn,
        failed = layout.failed_dsn,
        store = layout.store,
        lease = humantime(plan.lease),
        reap = humantime(plan.reap_every),
    )
}
