//! The hand-over of the write lock from one transaction of transactional mode to the next (see
//! `store::writers`), on a real SQLite file: what is committed, what is handed over, and that a
//! transaction handed over for a request that left never keeps the lock.

use std::{pin::pin, time::Duration};

use bytes::Bytes;
use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
    Connection, Sqlite, SqliteConnection, SqlitePool, Transaction,
};

use super::SqliteStore;
use crate::{
    fingerprint::Fingerprint,
    key::KeyHash,
    store::{
        writers::{TransactionTurn, WriterQueue},
        Claim, ClaimOutcome, Fenced, FencingToken, Hold, Store, StoredResponse, TransactionalStore,
    },
};

const LIMIT: Duration = Duration::from_secs(10);

/// A migrated store on a fresh file (`tidem_*.db`, which `scripts/test.sh` removes), with a
/// table `work` for the handlers' writes.
async fn store() -> (SqliteStore, SqliteConnectOptions) {
    let name = format!("tidem_hand_over_{}.db", uuid::Uuid::new_v4().simple());
    let options = SqliteConnectOptions::new()
        .filename(std::env::temp_dir().join(name))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(LIMIT);
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options.clone())
        .await
        .unwrap();
    sqlx::query("CREATE TABLE work (name TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let store = SqliteStore::new(pool);
    store.migrate().await.unwrap();
    (store, options)
}

/// A key claimed by a new request: its hold.
async fn claimed(store: &SqliteStore) -> Hold {
    let mut key = [0; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    let claim = Claim {
        key: KeyHash(key),
        fingerprint: Fingerprint([1; 32]),
        token: FencingToken::new(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    };
    let outcome = store.claim(&claim).await.unwrap();
    assert_eq!(outcome, ClaimOutcome::Claimed { taken_over: false });
    claim.hold()
}

fn answer() -> StoredResponse {
    StoredResponse::new(
        http::StatusCode::CREATED,
        http::HeaderMap::new(),
        Bytes::from_static(b"done"),
    )
}

/// A transaction begun as the mode begins one: its turn in the queue, then the transaction
/// handed over to it or a new one. `true`: it was handed over.
async fn begin(
    store: &SqliteStore,
) -> (TransactionTurn<Sqlite>, Transaction<'static, Sqlite>, bool) {
    let (turn, begun) = queue(store).transaction_turn().await;
    let handed_over = begun.is_some();
    let tx = match begun {
        Some(tx) => tx,
        None => store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap(),
    };
    (turn, tx, handed_over)
}

fn queue(store: &SqliteStore) -> WriterQueue<Sqlite> {
    store.writer_queue().expect("SQLite has a writer queue")
}

/// Save the answer in the transaction and end it, as the mode does.
async fn save(
    store: &SqliteStore,
    tx: Transaction<'static, Sqlite>,
    turn: TransactionTurn<Sqlite>,
    hold: &Hold,
) -> Fenced {
    let answer = answer();
    store
        .complete_and_commit(tx, Some(turn), hold, &answer, LIMIT)
        .await
        .unwrap()
}

async fn work(tx: &mut Transaction<'static, Sqlite>, name: &str) {
    sqlx::query("INSERT INTO work (name) VALUES (?1)")
        .bind(name)
        .execute(&mut **tx)
        .await
        .unwrap();
}

async fn done_work(store: &SqliteStore) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM work ORDER BY name")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

/// The next request's transaction (its key claimed with `hold`), spawned: it waits for its
/// turn, writes `b`, saves and commits. Answers whether it was handed over, once it waits.
async fn next_transaction(store: &SqliteStore, hold: Hold) -> tokio::task::JoinHandle<bool> {
    let next = store.clone();
    let task = tokio::spawn(async move {
        let (turn, mut tx, handed_over) = begin(&next).await;
        work(&mut tx, "b").await;
        assert_eq!(save(&next, tx, turn, &hold).await, Fenced::Applied);
        handed_over
    });
    while queue(store).waiting() == 0 {
        tokio::task::yield_now().await;
    }
    task
}

#[tokio::test]
async fn a_commit_begins_the_next_transaction_for_the_one_that_waits() {
    let (store, _) = store().await;
    let (hold, next_hold) = (claimed(&store).await, claimed(&store).await);
    let (turn, mut tx, handed_over) = begin(&store).await;
    assert!(!handed_over, "nothing ran before the first transaction");
    work(&mut tx, "a").await;
    let next = next_transaction(&store, next_hold).await;
    assert_eq!(save(&store, tx, turn, &hold).await, Fenced::Applied);
    assert!(
        next.await.unwrap(),
        "the waiting transaction began on its own"
    );
    assert_eq!(store.transactions_handed_over(), 1);
    assert_eq!(done_work(&store).await, ["a", "b"]);
}

#[tokio::test]
async fn a_fenced_out_transaction_commits_nothing_and_hands_nothing_over() {
    let (store, _) = store().await;
    let stale = claimed(&store).await;
    store.release(&stale).await.unwrap();
    let next_hold = claimed(&store).await;
    let (turn, mut tx, _) = begin(&store).await;
    work(&mut tx, "a").await;
    let next = next_transaction(&store, next_hold).await;
    assert_eq!(save(&store, tx, turn, &stale).await, Fenced::Lost);
    assert!(!next.await.unwrap(), "a fenced-out transaction handed over");
    assert_eq!(store.transactions_handed_over(), 0);
    assert_eq!(
        done_work(&store).await,
        ["b"],
        "the fenced-out work committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_handed_over_to_a_request_that_left_releases_the_lock() {
    let (store, options) = store().await;
    let queue = queue(&store);
    let (turn, _, _) = begin(&store).await;
    {
        let mut waiting = pin!(queue.transaction_turn());
        let polled = futures_util::future::poll_immediate(waiting.as_mut()).await;
        assert!(polled.is_none(), "the queue is held");
        assert!(turn.next_waits());
        let next = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
        turn.hand_over(next);
        // The request leaves before its turn comes: `waiting` drops here, unserved.
    }
    // Another process's writer: it gets the file's write lock once the queue rolled the
    // handed-over transaction back, or fails after its busy timeout.
    let mut other = SqliteConnection::connect_with(&options.busy_timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("INSERT INTO work (name) VALUES ('other')")
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    assert_eq!(done_work(&store).await, ["other"]);
    assert_eq!(store.transactions_handed_over(), 0);
}
