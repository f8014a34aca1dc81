//! `stats`: counts by state and the oldest running record, read with each backend's own query.

use std::time::Duration;

use tower_idempotency::store::{
    postgres::sqlx::{self, PgPool},
    redis::redis::{self, AsyncCommands},
    sqlite::sqlx::SqlitePool,
};

/// Live records by state, expired ones not swept yet, and how long ago the oldest running
/// record was claimed.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) running: u64,
    pub(crate) done: u64,
    pub(crate) expired: u64,
    pub(crate) oldest_running: Option<Duration>,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

pub(crate) async fn postgres(pool: &PgPool) -> Result<Stats, Error> {
    let (running, done, expired, oldest_ms): (i64, i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT
            count(*) FILTER (WHERE state = 'running' AND expires_at > now()),
            count(*) FILTER (WHERE state = 'done' AND expires_at > now()),
            count(*) FILTER (WHERE expires_at <= now()),
            (EXTRACT(EPOCH FROM (now() - min(created_at) FILTER (WHERE state = 'running' AND expires_at > now()))) * 1000)::bigint
         FROM idempotency_records",
    )
    .fetch_one(pool)
    .await?;
    Ok(stats(running, done, expired, oldest_ms))
}

pub(crate) async fn sqlite(pool: &SqlitePool) -> Result<Stats, Error> {
    let (running, done, expired, oldest_ms): (i64, i64, i64, Option<i64>) = sqlx::query_as(
        "SELECT
            coalesce(sum(state = 'running' AND expires_at > now), 0),
            coalesce(sum(state = 'done' AND expires_at > now), 0),
            coalesce(sum(expires_at <= now), 0),
            now - min(CASE WHEN state = 'running' AND expires_at > now THEN created_at END)
         FROM idempotency_records,
              (SELECT CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now)",
    )
    .fetch_one(pool)
    .await?;
    Ok(stats(running, done, expired, oldest_ms))
}

/// Redis: a SCAN over the prefix (records expire by themselves, so none is expired). Records keep
/// no claim time, so the oldest running one is not known.
pub(crate) async fn redis(client: &redis::Client, prefix: &str) -> Result<Stats, Error> {
    let mut conn = client.get_multiplexed_async_connection().await?;
    let pattern = format!("{prefix}:{{*}}");
    let mut keys = Vec::new();
    {
        let mut iter: redis::AsyncIter<'_, String> = conn.scan_match(&pattern).await?;
        while let Some(key) = iter.next_item().await {
            keys.push(key?);
        }
    }
    let mut stats = Stats::default();
    for key in keys {
        let state: Option<String> = conn.hget(&key, "state").await?;
        match state.as_deref() {
            Some("running") => stats.running += 1,
            Some("done") => stats.done += 1,
            _ => {}
        }
    }
    Ok(stats)
}

fn stats(running: i64, done: i64, expired: i64, oldest_ms: Option<i64>) -> Stats {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Stats {
        running: count(running),
        done: count(done),
        expired: count(expired),
        oldest_running: oldest_ms.map(|ms| Duration::from_millis(count(ms))),
    }
}
