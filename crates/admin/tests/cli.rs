//! The operator tool as an operator runs it: the real binary against real PostgreSQL, SQLite,
//! MySQL (MariaDB) and Redis, on records the store wrote.

use std::{process::Output, time::Duration};

use tower_idempotency::{
    fingerprint::Fingerprint,
    store::{
        mysql::{sqlx::MySqlPool, MySqlStore},
        postgres::{sqlx, PostgresStore},
        redis::{redis, RedisStore},
        sqlite::SqliteStore,
        Claim, ClaimOutcome, FencingToken, Store, StoredResponse,
    },
    IdempotencyKey, KeyHash, Scope,
};
use tower_idempotency_testkit::{
    fresh_mysql, fresh_postgres, fresh_sqlite_path, redis_url, unique_name,
};

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

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn key_of(key: &str) -> KeyHash {
    IdempotencyKey::parse(key.as_bytes())
        .unwrap()
        .scoped_hash(&Scope::new("Bearer alice"))
}

fn claim(key: KeyHash, ttl: Duration) -> Claim {
    Claim::new(
        key,
        Fingerprint::of(&[b"POST", b"/orders"]),
        FencingToken::new(),
        Duration::from_secs(30).min(ttl),
        ttl,
    )
}

/// A done record for key `k` of the caller `Bearer alice`, as the layer would save it.
async fn save_one<S: Store>(store: &S) {
    let claim = claim(key_of("k"), Duration::from_secs(3600));
    store.claim(&claim).await.unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("location", "/orders/1".parse().unwrap());
    let saved = StoredResponse::new(
        http::StatusCode::CREATED,
        headers,
        bytes::Bytes::from("{\"orderId\":\"1\"}"),
    );
    assert!(store
        .complete(&claim.hold(), &saved)
        .await
        .unwrap()
        .applied());
}

/// A running record for key `r` of `Bearer alice`, and one record of another key that expired.
async fn run_one_and_expire_one<S: Store>(store: &S) -> KeyHash {
    let running = claim(key_of("r"), Duration::from_secs(3600));
    assert_eq!(
        store.claim(&running).await.unwrap(),
        ClaimOutcome::claimed()
    );
    let expired = claim(key_of("x"), Duration::from_millis(1));
    assert_eq!(
        store.claim(&expired).await.unwrap(),
        ClaimOutcome::claimed()
    );
    // No signal for the passing of time: look until the store's clock has passed the expiry.
    while store.get(&expired.key).await.unwrap().is_some() {
        tokio::task::yield_now().await;
    }
    running.key
}

/// stats, inspect (with and without the body, in and out of scope, by key hash), sweep, forget.
async fn the_verbs_on_saved_keys<S: Store>(url: &str, store: &S, prefix: &[&str]) {
    let run = |args: &'static [&'static str]| {
        let mut all = prefix.to_vec();
        all.extend_from_slice(args);
        async move { admin(url, &all).await }
    };
    let sweeps = store.name() != "redis";
    save_one(store).await;
    let running = run_one_and_expire_one(store).await;

    let stats = run(&["stats"]).await;
    assert!(stats.status.success(), "{stats:?}");
    let text = stdout(&stats);
    assert!(text.contains("running 1\n"), "{text}");
    assert!(text.contains("done    1\n"), "{text}");
    let expired = if sweeps { "expired 1 " } else { "expired 0 " };
    assert!(text.contains(expired), "{text}");
    assert!(
        text.contains(&format!("oldest running: {running}, claimed ")),
        "the running key's hash: {text}"
    );

    let other_scope = run(&["inspect", "k"]).await;
    assert_eq!(
        other_scope.status.code(),
        Some(2),
        "{}",
        stdout(&other_scope)
    );
    let inspect = run(&["inspect", "k", "--scope", "Bearer alice"]).await;
    assert!(inspect.status.success(), "{inspect:?}");
    let text = stdout(&inspect);
    assert!(text.contains("state      done"), "{text}");
    assert!(text.contains("status     201"), "{text}");
    assert!(
        text.contains("claimed    ") && text.contains(" ago"),
        "{text}"
    );
    assert!(text.contains("header     location: /orders/1"), "{text}");
    assert!(
        text.contains("expires in 59 min") || text.contains("expires in 60 min"),
        "{text}"
    );
    assert!(
        !text.contains("orderId"),
        "the body only with --body: {text}"
    );
    let with_body = run(&["inspect", "k", "--scope", "Bearer alice", "--body"]).await;
    assert!(stdout(&with_body).contains("{\"orderId\":\"1\"}"));
    // The scope from the environment, out of the command line.
    let mut from_env = prefix.to_vec();
    from_env.extend_from_slice(&["inspect", "k"]);
    let inspect = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-idempotency-admin"))
        .env("IDEMPOTENCY_SCOPE", "Bearer alice")
        .arg("--url")
        .arg(url)
        .args(&from_env)
        .output()
        .await
        .unwrap();
    assert!(stdout(&inspect).contains("status     201"), "{inspect:?}");

    // The hash `stats` printed names the running record.
    let mut by_hash = prefix.to_vec();
    let hex = running.to_hex();
    by_hash.extend_from_slice(&["inspect", "--hash", &hex]);
    let inspect = admin(url, &by_hash).await;
    assert!(inspect.status.success(), "{inspect:?}");
    assert!(stdout(&inspect).contains("state      running"));
    assert!(stdout(&inspect).contains(" s left"), "{inspect:?}");
    let bad_hash = run(&["inspect", "--hash", "abc"]).await;
    assert_eq!(bad_hash.status.code(), Some(1));
    assert!(stderr(&bad_hash).contains("64 hex digits"), "{bad_hash:?}");

    let sweep = run(&["sweep"]).await;
    assert!(sweep.status.success(), "{sweep:?}");
    let swept = if sweeps {
        "swept 1 expired records\n"
    } else {
        "swept 0 expired records: Redis deletes them itself\n"
    };
    assert!(stdout(&sweep).contains(swept), "{}", stdout(&sweep));

    let forget = run(&["forget", "k", "--scope", "Bearer alice"]).await;
    assert!(forget.status.success(), "{forget:?}");
    assert!(
        !stderr(&forget).contains("warning"),
        "a done record: {forget:?}"
    );
    let gone = run(&["inspect", "k", "--scope", "Bearer alice"]).await;
    assert_eq!(gone.status.code(), Some(2));
    // Forgetting the running record warns that a retry may now run its handler again.
    let mut forget_hash = prefix.to_vec();
    forget_hash.extend_from_slice(&["forget", "--hash", &hex]);
    let forget_running = admin(url, &forget_hash).await;
    assert!(forget_running.status.success(), "{forget_running:?}");
    assert!(
        stderr(&forget_running).contains("warning: the record was running"),
        "{forget_running:?}"
    );
    assert_eq!(admin(url, &forget_hash).await.status.code(), Some(2));

    let stats = run(&["stats"]).await;
    let text = stdout(&stats);
    assert!(
        text.contains("running 0\ndone    0\nexpired 0 (not swept yet)\noldest running: none"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_migrate_check_inspect_stats_forget_sweep() {
    let url = fresh_postgres("tidem_admin").await.url;

    let unmigrated = admin(&url, &["check"]).await;
    assert_eq!(unmigrated.status.code(), Some(1));
    assert!(stderr(&unmigrated).contains("migrate"), "{unmigrated:?}");
    assert!(admin(&url, &["migrate"]).await.status.success());
    assert!(admin(&url, &["check"]).await.status.success());

    let store = PostgresStore::new(sqlx::PgPool::connect(&url).await.unwrap());
    the_verbs_on_saved_keys(&url, &store, &[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_migrate_check_inspect_stats_forget_sweep() {
    let file = fresh_sqlite_path("admin");
    // No `?mode=rwc`: `migrate` makes the file, every other verb needs it to exist.
    let url = format!("sqlite://{}", file.display());
    let unmigrated = admin(&url, &["check"]).await;
    assert_eq!(unmigrated.status.code(), Some(1));
    assert!(stderr(&unmigrated).contains("migrate"), "{unmigrated:?}");
    assert!(admin(&url, &["migrate"]).await.status.success());
    assert!(admin(&url, &["check"]).await.status.success());
    let store = SqliteStore::new(
        tower_idempotency::store::sqlite::sqlx::SqlitePool::connect(&url)
            .await
            .unwrap(),
    );
    the_verbs_on_saved_keys(&url, &store, &[]).await;
}

/// A record this version cannot decode pins its key: `forget` warns and deletes it anyway. And
/// `--hash` names a record whatever `IDEMPOTENCY_SCOPE` the operator's shell exports.
#[tokio::test(flavor = "multi_thread")]
async fn sqlite_forget_deletes_a_record_it_cannot_read_whatever_the_exported_scope() {
    let file = fresh_sqlite_path("admin-unreadable");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let pool = tower_idempotency::store::sqlite::sqlx::SqlitePool::connect(&url)
        .await
        .unwrap();
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.unwrap();
    save_one(&store).await;
    tower_idempotency::store::sqlite::sqlx::query("UPDATE idempotency_records SET headers = x'ff'")
        .execute(&pool)
        .await
        .unwrap();
    let hex = key_of("k").to_hex();
    let inspect = admin(&url, &["inspect", "--hash", &hex]).await;
    assert_eq!(inspect.status.code(), Some(1), "{inspect:?}");

    let forget = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-idempotency-admin"))
        .args(["--url", &url, "forget", "--hash", &hex])
        .env("IDEMPOTENCY_SCOPE", "Bearer somebody")
        .output()
        .await
        .expect("run the admin tool");
    assert!(forget.status.success(), "{forget:?}");
    assert!(stderr(&forget).contains("could not be read"), "{forget:?}");
    let gone = admin(&url, &["inspect", "--hash", &hex]).await;
    assert_eq!(gone.status.code(), Some(2), "{gone:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_on_another_table_with_the_table_flag() {
    let file = fresh_sqlite_path("admin");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let table = ["--table", "ops_idempotency"];
    assert!(admin(&url, &[&table[..], &["migrate"]].concat())
        .await
        .status
        .success());
    assert!(admin(&url, &[&table[..], &["check"]].concat())
        .await
        .status
        .success());
    // The default table was not created.
    let unmigrated = admin(&url, &["check"]).await;
    assert_eq!(unmigrated.status.code(), Some(1));
    assert!(
        stderr(&unmigrated).contains("idempotency_records"),
        "{unmigrated:?}"
    );
    let refused = admin(&url, &["--table", "ops; DROP TABLE x", "check"]).await;
    // A command line that does not parse exits 64, not the 2 of "no such record".
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert!(
        stderr(&refused).contains("invalid table name"),
        "{refused:?}"
    );

    let pool = tower_idempotency::store::sqlite::sqlx::SqlitePool::connect(&url)
        .await
        .unwrap();
    let store = SqliteStore::new(pool).with_table("ops_idempotency".parse().unwrap());
    the_verbs_on_saved_keys(&url, &store, &table).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mysql_migrate_check_inspect_stats_forget_sweep() {
    let url = fresh_mysql("tidem_admin").await.url;

    let unmigrated = admin(&url, &["check"]).await;
    assert_eq!(unmigrated.status.code(), Some(1), "{unmigrated:?}");
    let text = stderr(&unmigrated);
    assert!(
        text.contains("not ready: ")
            && text.contains("idempotency_records is missing")
            && text.contains("MySqlStore::migrate()"),
        "{text}"
    );
    let migrate = admin(&url, &["migrate"]).await;
    assert!(migrate.status.success(), "{migrate:?}");
    assert!(stdout(&migrate).contains("migrated"));
    assert!(admin(&url, &["migrate"]).await.status.success(), "twice");
    let check = admin(&url, &["check"]).await;
    assert!(
        stdout(&check).contains("schema present and current"),
        "{check:?}"
    );

    let store = MySqlStore::new(MySqlPool::connect(&url).await.unwrap());
    the_verbs_on_saved_keys(&url, &store, &[]).await;
    // MariaDB users often write `mariadb://`: the tool reads it as `mysql://`.
    let mariadb = url.replacen("mysql:", "mariadb:", 1);
    assert!(admin(&mariadb, &["stats"]).await.status.success());
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_check_inspect_stats_forget() {
    let url = redis_url();
    let prefix = unique_name("tidem_admin");
    let store = RedisStore::connect(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap()
        .with_prefix(prefix.clone());
    // The prefix is a global flag: pass it before the command.
    let check = admin(&url, &["--prefix", &prefix, "check"]).await;
    assert!(check.status.success(), "{check:?}");
    let migrate = admin(&url, &["migrate"]).await;
    assert!(stdout(&migrate).contains("Redis needs no migration"));
    the_verbs_on_saved_keys(&url, &store, &["--prefix", &prefix]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_urls_are_refused_with_the_schemes() {
    let refused = admin("http://127.0.0.1", &["stats"]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("postgres://, sqlite://, mysql:// or redis://"),
        "{refused:?}"
    );
}

/// `--help` shows where the store's URL comes from (`DATABASE_URL`), never its value: the URL
/// may hold a password.
#[tokio::test]
async fn help_does_not_print_the_urls_password() {
    let help = tokio::process::Command::new(env!("CARGO_BIN_EXE_tower-idempotency-admin"))
        .arg("--help")
        .env("DATABASE_URL", "mysql://root:s3cret-pass@127.0.0.1/x")
        .output()
        .await
        .expect("run the admin tool");
    assert!(help.status.success(), "{}", stderr(&help));
    let text = stdout(&help);
    assert!(text.contains("DATABASE_URL"), "{text}");
    assert!(!text.contains("s3cret-pass"), "{text}");
}
