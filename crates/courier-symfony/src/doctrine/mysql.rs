//! The MySQL / MariaDB parts of the Doctrine layout: the table as DBAL creates it, with its
//! index names, and the claim in two statements of one transaction.

/// As Doctrine DBAL 3 lays the table out on MySQL / MariaDB (`BIGINT AUTO_INCREMENT`,
/// `LONGTEXT`, `DATETIME`, InnoDB), its indexes inside (named by [`mysql_index`] as DBAL names
/// them, so that a PHP schema diff finds them). `utf8mb4`, as Symfony's recipes configure
/// Doctrine (DBAL's own default, `utf8mb3`, cannot hold 4-byte characters).
pub(crate) const MYSQL_CREATE: &str = "CREATE TABLE IF NOT EXISTS {t} (id BIGINT AUTO_INCREMENT NOT NULL, \
     body LONGTEXT NOT NULL, headers LONGTEXT NOT NULL, queue_name VARCHAR(190) NOT NULL, \
     created_at DATETIME NOT NULL, available_at DATETIME NOT NULL, \
     delivered_at DATETIME DEFAULT NULL, \
     INDEX {i_queue_name} (queue_name), INDEX {i_available_at} (available_at), \
     INDEX {i_delivered_at} (delivered_at), PRIMARY KEY(id)) \
     DEFAULT CHARACTER SET utf8mb4 COLLATE `utf8mb4_unicode_ci` ENGINE = InnoDB";

/// The claim on MariaDB, in a transaction with the `UPDATE` of `delivered_at` that follows:
/// PHP's predicate, skipping the rows PHP (or another worker) has locked.
const MYSQL_CLAIM: &str = "SELECT id, body, headers FROM {t} WHERE queue_name = ? \
     AND (delivered_at IS NULL OR delivered_at < ?) AND available_at <= ? \
     ORDER BY available_at ASC LIMIT ? FOR UPDATE SKIP LOCKED";

/// How often a claim on MariaDB is tried again when the server picked it as a deadlock's victim
/// (PHP's `FOR UPDATE` takes gap locks); after that, nothing is claimed this time.
pub(crate) const MYSQL_CLAIM_TRIES: usize = 3;

/// The name Doctrine DBAL gives an index of `column` on `table`: `IDX_` and the hexadecimal
/// CRC-32s of both names (PHP's `dechex`, no padding), upper case, at most 30 characters.
pub(crate) fn mysql_index(table: &str, column: &str) -> String {
    let mut name = format!(
        "IDX_{:x}{:x}",
        crc32(table.as_bytes()),
        crc32(column.as_bytes())
    )
    .to_ascii_uppercase();
    name.truncate(30);
    name
}

/// CRC-32 (IEEE), as PHP's `crc32`.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Whether MariaDB refused a statement for a deadlock or a lock wait timeout.
pub(crate) fn lock_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| matches!(d.number(), 1205 | 1213))
}

/// One claim on MariaDB: `SELECT ... FOR UPDATE SKIP LOCKED`, then `delivered_at` set on what
/// it found, in one transaction.
pub(crate) async fn mysql_claim(
    pool: &sqlx::MySqlPool,
    t: &str,
    queue: &str,
    now: &str,
    horizon: &str,
    limit: i64,
) -> Result<Vec<(i64, String, String)>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let rows: Vec<(i64, String, String)> = sqlx::query_as(&MYSQL_CLAIM.replace("{t}", t))
        .bind(queue)
        .bind(horizon)
        .bind(now)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
    if !rows.is_empty() {
        let ids: Vec<String> = rows.iter().map(|(id, _, _)| id.to_string()).collect();
        let sql = format!(
            "UPDATE {t} SET delivered_at = ? WHERE id IN ({})",
            ids.join(", ")
        );
        sqlx::query(&sql).bind(now).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(rows)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use std::time::Duration;

    use super::{lock_conflict, mysql_index};
    use crate::doctrine::sql::Pool;

    /// A write MariaDB picks as a deadlock's victim is sent again and goes through: another
    /// transaction holds row 2 and has changed 49 rows; the write (a delete of rows 1 and 2, as
    /// an ack of two messages) locks row 1 and waits for row 2; the other transaction then wants
    /// row 1, and MariaDB rolls back the lighter one, the write. Sent again, it waits for the
    /// other to commit, and deletes both rows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs MariaDB (scripts/services)"]
    async fn a_write_refused_for_a_deadlock_is_sent_again() {
        let pool = sqlx::MySqlPool::connect(&courier_test::env::mysql_url())
            .await
            .unwrap();
        let t = courier_test::env::unique_name("deadlock");
        sqlx::query(&format!(
            "CREATE TABLE {t} (id BIGINT PRIMARY KEY, v INT NOT NULL) ENGINE = InnoDB"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let rows: Vec<String> = (1..=50).map(|i| format!("({i}, 0)")).collect();
        sqlx::query(&format!("INSERT INTO {t} VALUES {}", rows.join(", ")))
            .execute(&pool)
            .await
            .unwrap();
        let mut other = pool.begin().await.unwrap();
        sqlx::query(&format!("UPDATE {t} SET v = v + 1 WHERE id >= 2"))
            .execute(&mut *other)
            .await
            .unwrap();
        let (writer, table) = (Pool::Mysql(pool.clone()), t.clone());
        let write = tokio::spawn(async move { writer.delete_many(&table, &[1, 2]).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let other_row_1 = sqlx::query(&format!("UPDATE {t} SET v = v + 1 WHERE id = 1"))
            .execute(&mut *other)
            .await;
        other.commit().await.unwrap();
        let done = tokio::time::timeout(Duration::from_secs(30), write).await;
        let (left,): (i64,) =
            sqlx::query_as(&format!("SELECT COUNT(*) FROM {t} WHERE id IN (1, 2)"))
                .fetch_one(&pool)
                .await
                .unwrap();
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(&pool)
            .await
            .unwrap();
        assert!(
            other_row_1.is_ok(),
            "the heavier transaction was picked: {other_row_1:?}"
        );
        let done = done.unwrap().unwrap();
        assert!(
            done.is_ok(),
            "the write was not sent again: {done:?} (a lock conflict: {})",
            done.as_ref().err().is_some_and(lock_conflict)
        );
        assert_eq!(left, 0);
    }

    #[test]
    fn index_names_are_doctrine_dbals() {
        // What DBAL 3.6 named them on MariaDB for a table `i42ddl_probe`.
        assert_eq!(
            mysql_index("i42ddl_probe", "queue_name"),
            "IDX_CF078000FB7336F0"
        );
        assert_eq!(
            mysql_index("i42ddl_probe", "available_at"),
            "IDX_CF078000E3BD61CE"
        );
        assert_eq!(
            mysql_index("i42ddl_probe", "delivered_at"),
            "IDX_CF07800016BA31DB"
        );
    }
}
