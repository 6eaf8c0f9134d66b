//! Statements on deliveries: one by id, or a batch grouped by delivery id and chunked.

use std::fmt::Write as _;

use super::{CHUNK, MessageDialect, Messages};

/// `(delivery_id = ? AND id IN (?, ...)) OR ...`, grouping the pairs by delivery id (a fetched
/// batch shares one); returns the predicate and the values to bind in order.
pub(crate) fn grouped_deliveries(deliveries: &[(i64, i64)]) -> (String, Vec<i64>) {
    let mut groups: Vec<(i64, Vec<i64>)> = Vec::new();
    for &(id, delivery) in deliveries {
        match groups.iter_mut().find(|(d, _)| *d == delivery) {
            Some((_, ids)) => ids.push(id),
            None => groups.push((delivery, vec![id])),
        }
    }
    let mut sql = String::new();
    let mut binds = Vec::with_capacity(deliveries.len() + groups.len());
    for (i, (delivery, ids)) in groups.iter().enumerate() {
        if i > 0 {
            sql.push_str(" OR ");
        }
        let _ = write!(
            sql,
            "(delivery_id = ? AND id IN ({}))",
            vec!["?"; ids.len()].join(", ")
        );
        binds.push(*delivery);
        binds.extend(ids);
    }
    (sql, binds)
}

impl<DB> Messages<DB>
where
    DB: MessageDialect,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    /// A statement on one delivery (binds: id, delivery id); returns the rows matched.
    pub(super) async fn by_id(
        &self,
        sql: &str,
        id: i64,
        delivery_id: i64,
    ) -> Result<u64, sqlx::Error> {
        let _turn = self.write_turn().await;
        let done = sqlx::query(sql)
            .bind(id)
            .bind(delivery_id)
            .execute(self.writes())
            .await?;
        Ok(DB::rows_affected(&done))
    }

    /// `head WHERE <deliveries>`, chunked, in one transaction when there are several chunks;
    /// returns the rows matched. The caller holds the write turn.
    pub(super) async fn for_deliveries(
        &self,
        head: &str,
        deliveries: &[(i64, i64)],
    ) -> Result<u64, sqlx::Error> {
        if deliveries.len() > CHUNK {
            let mut tx = self.writes().begin().await?;
            let matched = self.for_deliveries_on(&mut tx, head, deliveries).await?;
            tx.commit().await?;
            return Ok(matched);
        }
        let mut conn = self.writes().acquire().await?;
        self.for_deliveries_on(&mut conn, head, deliveries).await
    }

    /// `head WHERE <deliveries>` on `conn`, in chunks (the dialect's own form when it has one);
    /// returns the rows matched.
    pub(super) async fn for_deliveries_on(
        &self,
        conn: &mut DB::Connection,
        head: &str,
        deliveries: &[(i64, i64)],
    ) -> Result<u64, sqlx::Error> {
        if let Some(done) = DB::for_deliveries(self, conn, head, deliveries).await {
            return done;
        }
        let mut matched = 0;
        for chunk in deliveries.chunks(CHUNK) {
            let (predicate, binds) = grouped_deliveries(chunk);
            let sql = DB::DIALECT.render(&format!("{head} WHERE {predicate}"));
            let mut q = sqlx::query(&sql);
            for b in binds {
                q = q.bind(b);
            }
            matched += DB::rows_affected(&q.execute(&mut *conn).await?);
        }
        Ok(matched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouped_deliveries_group_by_delivery() {
        let (sql, binds) = grouped_deliveries(&[(1, 9), (2, 9), (3, 7)]);
        assert_eq!(
            sql,
            "(delivery_id = ? AND id IN (?, ?)) OR (delivery_id = ? AND id IN (?))"
        );
        assert_eq!(binds, vec![9, 1, 2, 7, 3]);
    }
}
