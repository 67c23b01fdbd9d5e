//! The outbox: reports queued in the database until a server took them,
//! oldest first, with folding of progress rows, the bound on rows and
//! bytes, and the count of what the bound dropped.
//!
//! Each new row gets the next **report counter** (`meta` key
//! `report_counter`, the row's `counter` column) in the same transaction
//! that inserts it, so a power cut can never hand out one value twice; a
//! folded row keeps its counter. The counter of the newest row a server
//! took is `meta` `report_counter_delivered`.
//!
//! This file stores and counts; what a row says and when it is sent is
//! [`crate::report`]'s and the daemon's.

use super::*;

impl Store {
    /// Queue a report. A foldable report replaces the newest queued report
    /// of the same kind when that one is also foldable and is the newest
    /// row overall (so order is never changed), counting the occurrences.
    pub fn push_report(&self, r: &Report<'_>) -> Result<()> {
        self.push_report_besides(r, None)
    }

    /// [`Store::push_report`], never folding into row `in_flight` (a row
    /// being sent on another thread: what is folded into it would be lost
    /// when its delivery removes it).
    pub fn push_report_besides(&self, r: &Report<'_>, in_flight: Option<i64>) -> Result<()> {
        let now = Timestamp::now().0;
        if r.foldable {
            let newest: Option<(i64, String, bool)> = self
                .conn
                .query_row(
                    "SELECT seq, kind, foldable FROM outbox ORDER BY seq DESC LIMIT 1",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?;
            if let Some((seq, kind, true)) = newest {
                if kind == r.kind && Some(seq) != in_flight {
                    self.conn.execute(
                        "UPDATE outbox SET count = count + 1, updated = ?1, body = ?2 WHERE seq = ?3",
                        params![now, r.body, seq],
                    )?;
                    return Ok(());
                }
            }
        }
        // A savepoint: one transaction of its own when called alone, part
        // of the caller's (a transition's) otherwise.
        self.conn.execute_batch("SAVEPOINT report_counter")?;
        let inserted = self.next_report_counter().and_then(|counter| {
            self.conn.execute(
                "INSERT INTO outbox (key, kind, created, updated, count, foldable, body, counter)
                 VALUES (?1, ?2, ?3, ?3, 1, ?4, ?5, ?6)",
                params![r.key, r.kind, now, r.foldable, r.body, counter as i64],
            )?;
            self.conn.execute(
                "INSERT INTO meta (key, value) VALUES ('report_counter', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![counter.to_string()],
            )?;
            Ok(())
        });
        match inserted {
            Ok(()) => self.conn.execute_batch("RELEASE report_counter")?,
            Err(e) => {
                let _ = self
                    .conn
                    .execute_batch("ROLLBACK TO report_counter; RELEASE report_counter");
                return Err(e);
            }
        }
        Ok(())
    }

    /// The counter the next new row gets: one more than the highest ever
    /// allocated. The highest queued row's counter counts too, so a `meta`
    /// value made unreadable can never make a counter repeat.
    fn next_report_counter(&self) -> Result<u64> {
        let stored: u64 = self
            .get("report_counter")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let queued: i64 =
            self.conn
                .query_row("SELECT COALESCE(MAX(counter), 0) FROM outbox", [], |r| {
                    r.get(0)
                })?;
        Ok(stored.max(queued.max(0) as u64) + 1)
    }

    /// The counter of the newest row a server took (0 before the first).
    pub fn report_counter_delivered(&self) -> Result<u64> {
        Ok(self
            .get("report_counter_delivered")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// The oldest queued reports, in order.
    pub fn outbox_peek(&self, limit: usize) -> Result<Vec<OutboxEntry>> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, key, kind, created, updated, count, body, counter FROM outbox ORDER BY seq LIMIT ?1",
        )?;
        let rows = stmt.query_map(params![limit as i64], |r| {
            Ok(OutboxEntry {
                seq: r.get(0)?,
                key: r.get(1)?,
                kind: r.get(2)?,
                created: Timestamp(r.get(3)?),
                updated: Timestamp(r.get(4)?),
                count: r.get(5)?,
                body: r.get(6)?,
                counter: r.get::<_, Option<i64>>(7)?.map(|c| c.max(0) as u64),
            })
        })?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::from)
    }

    /// Drop a delivered report.
    pub fn outbox_ack(&self, seq: i64) -> Result<()> {
        self.conn
            .execute("DELETE FROM outbox WHERE seq = ?1", params![seq])?;
        Ok(())
    }

    /// Drop a report a server took, recording its counter as the newest
    /// delivered, in one transaction.
    pub fn outbox_ack_delivered(&self, seq: i64, counter: Option<u64>) -> Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute("DELETE FROM outbox WHERE seq = ?1", params![seq])?;
        if let Some(c) = counter {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('report_counter_delivered', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![c.to_string()],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Rows queued and the bytes of their bodies.
    pub fn outbox_usage(&self) -> Result<(u64, u64)> {
        let (rows, bytes): (i64, i64) = self.conn.query_row(
            "SELECT COUNT(*), COALESCE(SUM(length(body)), 0) FROM outbox",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok((rows.max(0) as u64, bytes.max(0) as u64))
    }

    /// Every queued row's sequence number, kind and body size, oldest
    /// first.
    pub fn outbox_sizes(&self) -> Result<Vec<Queued>> {
        let mut stmt = self
            .conn
            .prepare("SELECT seq, kind, length(body) FROM outbox ORDER BY seq")?;
        let rows = stmt.query_map([], |r| {
            Ok(Queued {
                seq: r.get(0)?,
                kind: r.get(1)?,
                bytes: r.get::<_, i64>(2)?.max(0) as u64,
            })
        })?;
        rows.collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Error::from)
    }

    /// Drop undelivered rows `seqs` and add them to the count of dropped
    /// reports (`meta` key `outbox_dropped`), in one transaction. Returns
    /// the new count.
    pub fn outbox_drop(&self, seqs: &[i64]) -> Result<u64> {
        let tx = self.conn.unchecked_transaction()?;
        for seq in seqs {
            tx.execute("DELETE FROM outbox WHERE seq = ?1", params![seq])?;
        }
        let before: u64 = tx
            .query_row(
                "SELECT value FROM meta WHERE key = 'outbox_dropped'",
                [],
                |r| r.get::<_, String>(0),
            )
            .optional()?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let total = before.saturating_add(seqs.len() as u64);
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('outbox_dropped', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            params![total.to_string()],
        )?;
        tx.commit()?;
        Ok(total)
    }

    /// Reports dropped from a full outbox since the database was made.
    pub fn outbox_dropped(&self) -> Result<u64> {
        Ok(self
            .get("outbox_dropped")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    pub fn outbox_len(&self) -> Result<u64> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get::<_, i64>(0))?
            as u64)
    }
}
