//! The operator tool as an operator runs it: the real binary against real PostgreSQL, SQLite and
//! Redis, on a record the store wrote.

use std::{process::Output, time::Duration};

use tower_idempotency::{
    fingerprint::Fingerprint,
    store::{
        postgres::{sqlx, PostgresStore},
        redis::{redis, RedisStore},
        sqlite::SqliteStore,
        Claim, FencingToken, Store, StoredResponse,
    },
    IdempotencyKey, Scope,
};

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

async fn admin(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-idempotency-admin"))
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .await
        .expect("run the admin tool")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A done record for key `k` of the caller `Bearer alice`, as the layer would save it.
async fn save_one<S: Store>(store: &S) {
    let key = IdempotencyKey::parse(b"k")
        .unwrap()
        .scoped_hash(&Scope::new("Bearer alice"));
    let claim = Claim::new(
        key,
        Fingerprint::of(&[b"POST", b"/orders"]),
        FencingToken::new(),
        Duration::from_secs(30),
        Duration::from_secs(3600),
    );
    store.claim(&claim).await.unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("location", "/orders/1".parse().unwrap());
    let saved = StoredResponse::new(
        http::StatusCode::CREATED,
        headers,
        bytes::Bytes::from("{\"orderId\":\"1\"}"),
    );
    assert!(store
        .complete(&key, claim.token, &saved)
        .await
        .unwrap()
        .applied());
}

/// inspect (with and without the body, in and out of scope), stats, forget.
async fn the_verbs_on_one_saved_key(url: &str) {
    let other_scope = admin(url, &["inspect", "k"]).await;
    assert_eq!(
        other_scope.status.code(),
        Some(2),
        "{}",
        stdout(&other_scope)
    );

    let inspect = admin(url, &["inspect", "k", "--scope", "Bearer alice"]).await;
    assert!(inspect.status.success(), "{inspect:?}");
    let text = stdout(&inspect);
    assert!(text.contains("state      done"), "{text}");
    assert!(text.contains("status     201"), "{text}");
    assert!(text.contains("header     location: /orders/1"), "{text}");
    assert!(
        !text.contains("orderId"),
        "the body only with --body: {text}"
    );
    let with_body = admin(url, &["inspect", "k", "--scope", "Bearer alice", "--body"]).await;
    assert!(stdout(&with_body).contains("{\"orderId\":\"1\"}"));

    let stats = admin(url, &["stats"]).await;
    assert!(stats.status.success(), "{stats:?}");
    assert!(stdout(&stats).contains("done    1"), "{}", stdout(&stats));

    let forget = admin(url, &["forget", "k", "--scope", "Bearer alice"]).await;
    assert!(forget.status.success(), "{forget:?}");
    let gone = admin(url, &["inspect", "k", "--scope", "Bearer alice"]).await;
    assert_eq!(gone.status.code(), Some(2));
    let sweep = admin(url, &["sweep"]).await;
    assert!(sweep.status.success(), "{sweep:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_migrate_check_inspect_stats_forget_sweep() {
    let server =
        std::env::var("DATABASE_URL").expect("DATABASE_URL: a PostgreSQL server for this test");
    let name = unique("tidem_admin");
    let pool = sqlx::PgPool::connect(&server).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&pool)
        .await
        .unwrap();
    let url = format!("{}/{name}", server.rsplit_once('/').unwrap().0);

    let unmigrated = admin(&url, &["check"]).await;
    assert_eq!(unmigrated.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&unmigrated.stderr).contains("migrate"),
        "{unmigrated:?}"
    );
    assert!(admin(&url, &["migrate"]).await.status.success());
    assert!(admin(&url, &["check"]).await.status.success());

    let store = PostgresStore::new(sqlx::PgPool::connect(&url).await.unwrap());
    save_one(&store).await;
    the_verbs_on_one_saved_key(&url).await;
    store.pool().close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_migrate_check_inspect_stats_forget_sweep() {
    let file = std::env::temp_dir().join(format!("{}.db", unique("tidem_admin")));
    let url = format!("sqlite://{}?mode=rwc", file.display());
    assert_eq!(admin(&url, &["check"]).await.status.code(), Some(1));
    assert!(admin(&url, &["migrate"]).await.status.success());
    assert!(admin(&url, &["check"]).await.status.success());
    let store = SqliteStore::new(
        tower_idempotency::store::sqlite::sqlx::SqlitePool::connect(&url)
            .await
            .unwrap(),
    );
    save_one(&store).await;
    the_verbs_on_one_saved_key(&url).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_check_inspect_stats_forget() {
    let url = std::env::var("REDIS_URL").expect("REDIS_URL: a Redis server for this test");
    let prefix = unique("tidem_admin");
    let store = RedisStore::connect(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    assert!(admin(&url, &["--prefix", &prefix, "check"])
        .await
        .status
        .success());
    save_one(&store).await;
    let url_with_prefix = url.clone();
    // The prefix is a global flag: pass it before the command.
    let inspect = admin(
        &url_with_prefix,
        &[
            "--prefix",
            &prefix,
            "inspect",
            "k",
            "--scope",
            "Bearer alice",
        ],
    )
    .await;
    assert!(stdout(&inspect).contains("status     201"), "{inspect:?}");
    let stats = admin(&url, &["--prefix", &prefix, "stats"]).await;
    assert!(stdout(&stats).contains("done    1"), "{}", stdout(&stats));
    assert!(admin(
        &url,
        &[
            "--prefix",
            &prefix,
            "forget",
            "k",
            "--scope",
            "Bearer alice"
        ]
    )
    .await
    .status
    .success());
    assert_eq!(
        admin(
            &url,
            &[
                "--prefix",
                &prefix,
                "inspect",
                "k",
                "--scope",
                "Bearer alice"
            ]
        )
        .await
        .status
        .code(),
        Some(2)
    );
}
