//! The schema: migrating the message table and the tables beside it, and checking it when
//! `auto_setup` is off.

use std::sync::Arc;

use courier_core::{
    Dsn, MessageRegistry, Setup, TransportError, TransportErrorKind, WorkerRegistry, async_trait,
};

use super::SqlTransport;
use crate::SqlOptions;
use crate::migrate::Applied;

impl SqlTransport {
    /// Applies the messages migrations not yet recorded for this table (creating it on a fresh
    /// database); returns those it recorded, oldest first (empty when up to date).
    ///
    /// # Errors
    /// The database failed.
    pub async fn migrate(&self) -> Result<Vec<Applied>, TransportError> {
        let applied = self
            .attempt("migrating the messages table", || self.backend.setup())
            .await?;
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(applied.iter().map(ToString::to_string));
        if let Some(checked) = &self.schema_checked {
            let _ = checked.set(());
        }
        for migration in &applied {
            tracing::info!(
                messaging.destination.name = %self.name,
                courier.sql.table = %self.options.table_name,
                courier.sql.migration = %migration,
                "applied migration"
            );
        }
        Ok(applied)
    }

    /// Connects only the worker registry of the table the DSN names (`<table>_workers`), and
    /// creates its table if missing: where workers register when no transport of theirs has a
    /// registry (a RabbitMQ-only configuration whose run store is SQL). The message table is not
    /// created.
    ///
    /// # Errors
    /// As [`SqlTransport::connect`].
    pub async fn connect_worker_registry(
        name: impl Into<String>,
        dsn: &Dsn,
    ) -> Result<Arc<dyn WorkerRegistry>, TransportError> {
        let name = name.into();
        let options = SqlOptions::from_dsn(dsn)
            .map_err(|e| {
                TransportError::new(TransportErrorKind::Config, name.clone())
                    .with_context(e.to_string())
            })?
            .auto_setup(false);
        let backend = crate::connect::backend(&name, dsn, &options).await?;
        let transport = Self::assemble(
            name.clone(),
            dsn.clone(),
            options,
            Arc::new(MessageRegistry::new()),
            backend,
            None,
            false,
        )
        .await?;
        transport.migrate_workers().await?;
        courier_core::shared_worker_registry(Arc::new(transport)).ok_or_else(|| {
            TransportError::new(TransportErrorKind::Config, name).with_context("no worker registry")
        })
    }

    /// Applies the worker registry's migrations not yet recorded (`<table>_workers`); returns
    /// those it recorded. [`SqlTransport::migrate`] does it too.
    ///
    /// # Errors
    /// The database failed.
    pub async fn migrate_workers(&self) -> Result<Vec<Applied>, TransportError> {
        self.attempt("migrating the workers table", || {
            self.backend.setup_workers()
        })
        .await
    }

    /// With `auto_setup` off, checks once that every migration of the message table and the
    /// tables beside it is recorded: a schema the application's own migrations did not bring
    /// up to date is a [`TransportErrorKind::Config`] error naming the first missing
    /// migration, never a table created behind its back.
    ///
    /// # Errors
    /// A migration is missing, or the database failed.
    pub async fn check_schema(&self) -> Result<(), TransportError> {
        let Some(checked) = &self.schema_checked else {
            return Ok(());
        };
        checked
            .get_or_try_init(|| async {
                let missing = self
                    .attempt("checking the schema (auto_setup is off)", || {
                        self.backend.missing_migrations()
                    })
                    .await?;
                match missing.first() {
                    None => Ok(()),
                    Some(first) => Err(TransportError::new(
                        TransportErrorKind::Config,
                        self.name.clone(),
                    )
                    .with_context(format!(
                        "the schema of table `{}` is missing or older than this Courier and \
                         auto_setup is off: {first}{} (run `courier setup`, or apply the SQL of \
                         `courier setup --print-sql` with your migration tool)",
                        self.options.table_name,
                        if missing.len() > 1 {
                            format!(", and {} more", missing.len() - 1)
                        } else {
                            String::new()
                        }
                    ))),
                }
            })
            .await
            .map(|&()| ())
    }
}

#[async_trait]
impl Setup for SqlTransport {
    async fn setup(&self) -> Result<(), TransportError> {
        self.migrate().await.map(drop)
    }

    /// Migrates, and names every migration applied since this transport connected (its
    /// auto-setup included), oldest first.
    async fn setup_report(&self) -> Result<Vec<String>, TransportError> {
        self.migrate().await?;
        Ok(std::mem::take(
            &mut *self
                .applied
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }

    /// [`SqlTransport::check_schema`].
    async fn check(&self) -> Result<(), TransportError> {
        self.check_schema().await
    }
}
