//! The `process_once` suite shared by the SQL backends: each backend's test file expands it with
//! [`consumer_tests!`], naming its module, pool, connect helpers and the few statements whose SQL
//! differs. The tests land at the top of the test crate, so their names (which the crash test
//! passes to `--exact` when it re-runs itself as a child) are the same for every backend.

/// Expand every `process_once` test for one SQL backend.
///
/// - `backend`: the consumer type (`PgConsumer`, `SqliteConsumer`).
/// - `pool`, `database`: the sqlx pool and database types.
/// - `fresh`: `common` helper returning a fresh migrated `(pool, url)`; `empty`: one returning the
///   url of a fresh database nothing was migrated in; `connect`: `common` helper opening a pool on
///   an existing url (the crash test's child, a second instance).
/// - `insert_ten_two_day_old_rows`: SQL inserting `processed_events` rows `old_1..=old_10` for
///   consumer `ledger`, processed two days ago.
/// - `list_migration_tables`: SQL listing table names ending in `migrations`, ordered.
macro_rules! consumer_tests {
    (
        backend: $backend:ident,
        pool: $pool:ident,
        database: $database:ident,
        fresh: $fresh:ident,
        empty: $empty:ident,
        connect: $connect:ident,
        insert_ten_two_day_old_rows: $insert_ten_two_day_old_rows:expr,
        list_migration_tables: $list_migration_tables:expr $(,)?
    ) => {
        use std::{
            sync::{
                atomic::{AtomicUsize, Ordering},
                Arc,
            },
            time::Duration,
        };

        use common::{$connect, $empty, $fresh, run_child_and_kill_it, signal_ready_and_hang};
        use futures_util::future::BoxFuture;
        use sqlx::{$database, $pool};
        use tokio::sync::{oneshot, Barrier};
        use tower_idempotency_consumer::{$backend, Consumer, Error, Outcome};

        const CONSUMER: &str = "ledger";

        /// The consumer under test, named [`CONSUMER`].
        fn ledger(pool: &$pool) -> $backend {
            <$backend>::new(pool.clone(), CONSUMER)
        }

        type Work = Box<
            dyn for<'c> FnOnce(
                    &'c mut <$database as sqlx::Database>::Connection,
                ) -> BoxFuture<'c, Result<i32, sqlx::Error>>
                + Send,
        >;

        /// The work of one delivery: one row in `effects`, written in the transaction.
        fn record(event_id: &'static str, delivery: i32) -> Work {
            Box::new(move |tx| {
                Box::pin(async move {
                    sqlx::query("INSERT INTO effects (event_id, delivery) VALUES ($1, $2)")
                        .bind(event_id)
                        .bind(delivery)
                        .execute(&mut *tx)
                        .await?;
                    Ok(delivery)
                })
            })
        }

        async fn effects(pool: &$pool, event_id: &str) -> Vec<i32> {
            sqlx::query_scalar("SELECT delivery FROM effects WHERE event_id = $1 ORDER BY delivery")
                .bind(event_id)
                .fetch_all(pool)
                .await
                .expect("read effects")
        }

        async fn processed_rows(pool: &$pool, event_id: &str) -> i64 {
            sqlx::query_scalar(
                "SELECT count(*) FROM processed_events WHERE consumer = $1 AND event_id = $2 AND status = 'processed'",
            )
            .bind(CONSUMER)
            .bind(event_id)
            .fetch_one(pool)
            .await
            .expect("count processed_events")
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn ten_concurrent_deliveries_run_the_work_once() {
            let (pool, _) = $fresh().await;
            let barrier = Arc::new(Barrier::new(common::DELIVERIES));
            let runs = Arc::new(AtomicUsize::new(0));
            let deliveries: Vec<_> = (0..common::DELIVERIES)
                .map(|delivery| {
                    let (pool, barrier, runs) = (pool.clone(), barrier.clone(), runs.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        ledger(&pool).process_once("evt_1", |tx| {
                            Box::pin(async move {
                                runs.fetch_add(1, Ordering::SeqCst);
                                // Work that takes a while, so that the others arrive while it runs.
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                record("evt_1", delivery as i32)(tx).await
                            })
                        })
                        .await
                    })
                })
                .collect();
            let mut processed = 0;
            let mut duplicates = 0;
            for delivery in deliveries {
                match delivery.await.expect("no panic").expect("no error") {
                    Outcome::Processed(_) => processed += 1,
                    Outcome::Duplicate => duplicates += 1,
                    other => panic!("neither processed nor a duplicate: {other:?}"),
                }
            }
            assert_eq!((processed, duplicates), (1, common::DELIVERIES - 1));
            assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
            assert_eq!(effects(&pool, "evt_1").await.len(), 1);
            assert_eq!(processed_rows(&pool, "evt_1").await, 1);
        }

        /// An id the database cannot take would fail every delivery before its failure is
        /// counted: it is refused without running the work or touching the table.
        #[tokio::test(flavor = "multi_thread")]
        async fn an_event_id_no_store_can_record_is_refused_before_the_work() {
            let (pool, _) = $fresh().await;
            let too_long = "e".repeat(tower_idempotency_consumer::MAX_EVENT_ID_LEN + 1);
            for event_id in ["evt\0nul", too_long.as_str()] {
                let refused = ledger(&pool).process_once(event_id, record("evt_1", 1)).await;
                assert!(matches!(refused, Err(Error::InvalidEventId)), "{refused:?}");
                assert!(!refused.unwrap_err().should_redeliver());
            }
            assert_eq!(effects(&pool, "evt_1").await, Vec::<i32>::new());
            let longest = "e".repeat(tower_idempotency_consumer::MAX_EVENT_ID_LEN);
            let taken = ledger(&pool).process_once(&longest, record("evt_1", 1)).await;
            assert_eq!(taken.expect("the longest id"), Outcome::Processed(1));
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_failed_work_rolls_back_and_the_redelivery_runs_it_once() {
            let (pool, _) = $fresh().await;
            let failed = ledger(&pool).process_once("evt_1", |tx| {
                Box::pin(async move {
                    record("evt_1", 1)(tx).await?;
                    Err::<i32, _>(sqlx::Error::Protocol("the payment provider said no".into()))
                })
            })
            .await;
            assert!(matches!(failed, Err(Error::Work(_))), "{failed:?}");
            assert_eq!(
                effects(&pool, "evt_1").await,
                Vec::<i32>::new(),
                "the failed work's write is gone"
            );
            assert_eq!(processed_rows(&pool, "evt_1").await, 0);

            let retried = ledger(&pool).process_once("evt_1", record("evt_1", 2)).await;
            assert_eq!(retried.expect("redelivery"), Outcome::Processed(2));
            let again = ledger(&pool).process_once("evt_1", record("evt_1", 3)).await;
            assert_eq!(again.expect("third delivery"), Outcome::Duplicate);
            assert_eq!(effects(&pool, "evt_1").await, vec![2]);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_panic_rolls_back_and_the_redelivery_runs_it_once() {
            let (pool, _) = $fresh().await;
            let ledger_ = ledger(&pool);
            common::assert_panics(async move {
                ledger_.process_once("evt_1", |tx| {
                    Box::pin(async move {
                        record("evt_1", 1)(tx).await?;
                        panic!("the work panicked");
                        #[allow(unreachable_code)]
                        Ok::<i32, sqlx::Error>(1)
                    })
                })
                .await
            })
            .await;

            let retried = ledger(&pool).process_once("evt_1", record("evt_1", 2)).await;
            assert_eq!(retried.expect("redelivery"), Outcome::Processed(2));
            assert_eq!(effects(&pool, "evt_1").await, vec![2]);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_work_that_always_panics_is_parked_at_the_maximum_attempts() {
            let (pool, _) = $fresh().await;
            for _ in 0..2 {
                let ledger_ = ledger(&pool).with_max_attempts(std::num::NonZeroU32::new(2).expect("2"));
                common::assert_panics(async move {
                    ledger_
                        .process_once_with_payload("evt_1", Some(b"boom"), |_| {
                            Box::pin(async move {
                                panic!("the work panicked");
                                #[allow(unreachable_code)]
                                Ok::<i32, sqlx::Error>(1)
                            })
                        })
                        .await
                })
                .await;
            }
            let parked = ledger(&pool).parked(10).await.expect("list");
            assert_eq!(parked.len(), 1, "{parked:?}");
            assert_eq!(parked[0].attempts, 2);
            assert_eq!(
                parked[0].last_error.as_deref(),
                Some("the work panicked: the work panicked")
            );
            assert_eq!(parked[0].payload.as_deref(), Some(&b"boom"[..]));
            let skipped = ledger(&pool).process_once("evt_1", record("evt_1", 3)).await;
            assert_eq!(skipped.expect("parked"), Outcome::Parked { attempts: 2 });
        }

        /// A failure whose message holds a NUL (a work quoting its input) is still counted, and
        /// parks the event at the maximum: PostgreSQL's `text` refuses the NUL itself.
        #[tokio::test]
        async fn a_failure_whose_message_holds_a_nul_is_counted_and_parks() {
            let (pool, _) = $fresh().await;
            let ledger_ = || ledger(&pool).with_max_attempts(std::num::NonZeroU32::new(2).expect("2"));
            for attempt in 1..=2 {
                let failed = ledger_()
                    .process_once("evt_1", |_| {
                        Box::pin(async move {
                            Err::<i32, _>(sqlx::Error::Protocol("unknown variant `\0`".into()))
                        })
                    })
                    .await;
                let counted = match attempt {
                    1 => matches!(failed, Err(Error::Work(_))),
                    _ => matches!(failed, Err(Error::Parked(_))),
                };
                assert!(counted, "attempt {attempt}: {failed:?}");
            }
            let parked = ledger(&pool).parked(10).await.expect("list");
            assert_eq!(parked.len(), 1, "{parked:?}");
            assert_eq!(parked[0].attempts, 2);
            let error = parked[0].last_error.as_deref().expect("an error");
            assert!(error.contains("unknown variant `\u{FFFD}`"), "{error}");
        }

        /// Start a first delivery whose work waits for `go` (then commits if `commit`), and a second
        /// delivery once the first holds the event; return both outcomes.
        async fn overlapping_deliveries(
            pool: &$pool,
            commit: bool,
        ) -> (
            Result<Outcome<i32>, Error<sqlx::Error>>,
            Result<Outcome<i32>, Error<sqlx::Error>>,
        ) {
            let (started_tx, started_rx) = oneshot::channel();
            let (go_tx, go_rx) = oneshot::channel::<()>();
            let first = tokio::spawn({
                let pool = pool.clone();
                async move {
                    ledger(&pool).process_once("evt_1", move |tx| {
                        Box::pin(async move {
                            record("evt_1", 1)(tx).await?;
                            started_tx.send(()).expect("the test waits");
                            go_rx.await.expect("the test says go");
                            if commit {
                                Ok(1)
                            } else {
                                Err(sqlx::Error::Protocol(
                                    "failed after the second arrived".into(),
                                ))
                            }
                        })
                    })
                    .await
                }
            });
            started_rx
                .await
                .expect("the first delivery started its work");
            let mut second = tokio::spawn({
                let pool = pool.clone();
                async move { ledger(&pool).process_once("evt_1", record("evt_1", 2)).await }
            });
            let early = tokio::time::timeout(Duration::from_millis(300), &mut second).await;
            assert!(
                early.is_err(),
                "the second delivery must wait for the first: {early:?}"
            );
            go_tx.send(()).expect("the first delivery waits");
            let first = first.await.expect("no panic");
            let second = second.await.expect("no panic");
            (first, second)
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_concurrent_delivery_waits_for_the_commit_then_reports_duplicate() {
            let (pool, _) = $fresh().await;
            let (first, second) = overlapping_deliveries(&pool, true).await;
            assert_eq!(first.expect("first"), Outcome::Processed(1));
            assert_eq!(second.expect("second"), Outcome::Duplicate);
            assert_eq!(effects(&pool, "evt_1").await, vec![1]);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_concurrent_delivery_runs_the_work_when_the_first_rolls_back() {
            let (pool, _) = $fresh().await;
            let (first, second) = overlapping_deliveries(&pool, false).await;
            assert!(matches!(first, Err(Error::Work(_))), "{first:?}");
            assert_eq!(second.expect("second"), Outcome::Processed(2));
            assert_eq!(effects(&pool, "evt_1").await, vec![2]);
            assert_eq!(processed_rows(&pool, "evt_1").await, 1);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_crash_between_work_and_commit_leaves_nothing_and_the_redelivery_runs_once() {
            if let Ok(url) = std::env::var(common::CHILD_ENV) {
                // The child: do the work's write, then die (the parent kills us) before the commit.
                let pool = $connect(&url).await;
                let result =
                    ledger(&pool).process_once::<i32, sqlx::Error, _>("evt_1", |tx| {
                        Box::pin(async move {
                            record("evt_1", 1)(tx).await?;
                            signal_ready_and_hang().await
                        })
                    })
                    .await;
                panic!("the child should be killed while its work waits, but it ended: {result:?}");
            }
            let (pool, url) = $fresh().await;
            run_child_and_kill_it(
                "a_crash_between_work_and_commit_leaves_nothing_and_the_redelivery_runs_once",
                &url,
            )
            .await;
            assert_eq!(
                effects(&pool, "evt_1").await,
                Vec::<i32>::new(),
                "the killed work did not commit"
            );
            assert_eq!(processed_rows(&pool, "evt_1").await, 0);

            let retried = ledger(&pool).process_once("evt_1", record("evt_1", 2)).await;
            assert_eq!(retried.expect("redelivery"), Outcome::Processed(2));
            let again = ledger(&pool).process_once("evt_1", record("evt_1", 3)).await;
            assert_eq!(again.expect("third delivery"), Outcome::Duplicate);
            assert_eq!(effects(&pool, "evt_1").await, vec![2], "one effect");
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn consumers_are_independent() {
            let (pool, _) = $fresh().await;
            let ledger = <$backend>::new(pool.clone(), "ledger").process_once("evt_1", record("evt_1", 1)).await;
            let mailer = <$backend>::new(pool.clone(), "mailer").process_once("evt_1", record("evt_1", 2)).await;
            assert_eq!(ledger.expect("ledger"), Outcome::Processed(1));
            assert_eq!(mailer.expect("mailer"), Outcome::Processed(2));
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn sweep_deletes_only_old_rows_in_batches() {
            let (pool, _) = $fresh().await;
            sqlx::query(
                $insert_ten_two_day_old_rows,
            )
            .execute(&pool)
            .await
            .expect("old rows");
            for n in 0..3 {
                let event_id = format!("new_{n}");
                let done = ledger(&pool).process_once(&event_id, |_| {
                    Box::pin(async { Ok::<_, sqlx::Error>(()) })
                })
                .await;
                assert!(done.expect("new event").is_processed());
            }
            let day = Duration::from_secs(24 * 60 * 60);

            assert_eq!(
                ledger(&pool).sweep_batch(day, 4)
                    .await
                    .expect("one batch"),
                4
            );
            assert_eq!(ledger(&pool).sweep(day, 4).await.expect("the rest"), 6);
            assert_eq!(
                ledger(&pool).sweep(day, 4).await.expect("nothing left"),
                0
            );

            let left: Vec<String> =
                sqlx::query_scalar("SELECT event_id FROM processed_events ORDER BY event_id")
                    .fetch_all(&pool)
                    .await
                    .expect("remaining rows");
            assert_eq!(left, ["new_0", "new_1", "new_2"]);
            // A swept event is unknown again: its redelivery would run (the retention warning).
            let redelivered = ledger(&pool).process_once("old_1", record("old_1", 1)).await;
            assert_eq!(redelivered.expect("after sweep"), Outcome::Processed(1));
        }

        /// Consumers starting at once on a fresh database (each with its own pool) all migrate
        /// it, and it then takes events.
        #[tokio::test(flavor = "multi_thread")]
        async fn instances_starting_at_once_all_migrate() {
            let url = $empty().await;
            let mut starts = Vec::new();
            for _ in 0..4 {
                let pool = $connect(&url).await;
                starts.push(tokio::spawn(async move {
                    ledger(&pool).migrate().await.map_err(|e| e.to_string())
                }));
            }
            for start in starts {
                start
                    .await
                    .expect("the start task")
                    .expect("every instance migrates");
            }
            let pool = $connect(&url).await;
            let work: Work = Box::new(|_| Box::pin(async { Ok(7) }));
            let done = ledger(&pool).process_once("evt_m", work).await;
            assert_eq!(done.expect("the first event"), Outcome::Processed(7));
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn migrate_is_repeatable_and_keeps_to_its_own_table() {
            let (pool, _) = $fresh().await;
            ledger(&pool).migrate().await.expect("second migrate");
            let tables: Vec<String> = sqlx::query_scalar(
                $list_migration_tables,
            )
            .fetch_all(&pool)
            .await
            .expect("list tables");
            assert_eq!(tables, [tower_idempotency_consumer::sql::MIGRATIONS_TABLE]);
        }

        /// A work that always fails, saying which delivery it was.
        fn refuse(delivery: i32) -> Work {
            Box::new(move |tx| {
                Box::pin(async move {
                    record("evt_p", delivery)(tx).await?;
                    Err(sqlx::Error::Protocol(format!("declined on delivery {delivery}")))
                })
            })
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn claim_in_the_callers_transaction_commits_with_the_callers_writes() {
            let (pool, _) = $fresh().await;
            let ledger = ledger(&pool);

            // Rolled back: neither the write nor the mark stays.
            let mut tx = ledger.begin().await.expect("begin");
            let claim = ledger.claim(&mut tx, "evt_1").await.expect("claim");
            assert_eq!(claim, tower_idempotency_consumer::sql::Claim::Claimed { failed_attempts: 0 });
            sqlx::query("INSERT INTO effects (event_id, delivery) VALUES ('evt_1', 1)")
                .execute(&mut *tx)
                .await
                .expect("the caller's write");
            tx.rollback().await.expect("rollback");
            assert_eq!(processed_rows(&pool, "evt_1").await, 0);
            assert_eq!(effects(&pool, "evt_1").await, Vec::<i32>::new());

            // Committed: both stay, and the next claim is a duplicate.
            let mut tx = ledger.begin().await.expect("begin");
            assert!(matches!(
                ledger.claim(&mut tx, "evt_1").await.expect("claim"),
                tower_idempotency_consumer::sql::Claim::Claimed { .. }
            ));
            sqlx::query("INSERT INTO effects (event_id, delivery) VALUES ('evt_1', 2)")
                .execute(&mut *tx)
                .await
                .expect("the caller's write");
            tx.commit().await.expect("commit");
            let mut tx = ledger.begin().await.expect("begin");
            assert_eq!(
                ledger.claim(&mut tx, "evt_1").await.expect("claim"),
                tower_idempotency_consumer::sql::Claim::Duplicate
            );
            tx.rollback().await.expect("rollback");
            assert_eq!(effects(&pool, "evt_1").await, vec![2]);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn failures_are_counted_then_the_event_is_parked_listed_and_replayed() {
            let (pool, _) = $fresh().await;
            let ledger = ledger(&pool).with_max_attempts(std::num::NonZeroU32::new(3).expect("3"));
            let payload: &[u8] = br#"{"id":"evt_p"}"#;
            for delivery in 1..=2 {
                let failed = ledger.process_once_with_payload("evt_p", Some(payload), refuse(delivery)).await;
                assert!(matches!(failed, Err(Error::Work(_))), "delivery {delivery}: {failed:?}");
                assert!(failed.expect_err("failed").should_redeliver());
            }
            let last = ledger.process_once_with_payload("evt_p", Some(payload), refuse(3)).await;
            let last = last.expect_err("the third failure parks");
            assert!(matches!(last, Error::Parked(_)), "{last:?}");
            assert!(!last.should_redeliver(), "a parked event is settled: acknowledge it");
            assert_eq!(effects(&pool, "evt_p").await, Vec::<i32>::new(), "every failure rolled back");

            // Parked: later deliveries do not run the work.
            let runs = Arc::new(AtomicUsize::new(0));
            let counted: Work = {
                let runs = runs.clone();
                Box::new(move |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    record("evt_p", 4)(tx)
                })
            };
            let parked = ledger.process_once("evt_p", counted).await.expect("parked delivery");
            assert_eq!(parked, Outcome::Parked { attempts: 3 });
            assert!(parked.should_ack());
            assert_eq!(runs.load(Ordering::SeqCst), 0);

            let listed = ledger.parked(10).await.expect("list parked");
            assert_eq!(listed.len(), 1);
            assert_eq!(listed[0].event_id, "evt_p");
            assert_eq!(listed[0].attempts, 3);
            assert_eq!(listed[0].last_error.as_deref(), Some("encountered unexpected or invalid data: declined on delivery 3"));
            assert_eq!(listed[0].payload.as_deref(), Some(payload));
            assert!(ledger.parked(10).await.expect("list").len() == 1, "listing changes nothing");
            assert!(<$backend>::new(pool.clone(), "mailer").parked(10).await.expect("list").is_empty(), "per consumer");

            // Replay: the record comes back once, and the next delivery runs the work afresh.
            let replayed = ledger.replay("evt_p").await.expect("replay").expect("it was parked");
            assert_eq!(replayed.payload.as_deref(), Some(payload));
            assert_eq!(ledger.replay("evt_p").await.expect("replay again"), None);
            let done = ledger.process_once("evt_p", record("evt_p", 5)).await;
            assert_eq!(done.expect("replayed delivery"), Outcome::Processed(5));
            assert_eq!(effects(&pool, "evt_p").await, vec![5]);
            assert!(ledger.parked(10).await.expect("list").is_empty());
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_success_after_failures_is_processed_once_and_not_parked() {
            let (pool, _) = $fresh().await;
            let ledger = ledger(&pool).with_max_attempts(std::num::NonZeroU32::new(3).expect("3"));
            for delivery in 1..=2 {
                let failed = ledger.process_once("evt_p", refuse(delivery)).await;
                assert!(matches!(failed, Err(Error::Work(_))), "{failed:?}");
            }
            let mut tx = ledger.begin().await.expect("begin");
            let claim = ledger.claim(&mut tx, "evt_p").await.expect("claim");
            assert_eq!(claim, tower_idempotency_consumer::sql::Claim::Claimed { failed_attempts: 2 });
            tx.rollback().await.expect("rollback");
            let done = ledger.process_once("evt_p", record("evt_p", 3)).await;
            assert_eq!(done.expect("third delivery"), Outcome::Processed(3));
            let again = ledger.process_once("evt_p", refuse(4)).await;
            assert_eq!(again.expect("fourth delivery"), Outcome::Duplicate);
            assert_eq!(effects(&pool, "evt_p").await, vec![3]);
            assert!(ledger.parked(10).await.expect("list").is_empty());
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn a_table_of_its_own_has_its_own_migrations_and_marks() {
            let (pool, _) = $fresh().await;
            let table = tower_idempotency_consumer::sql::TableName::new("billing_events").expect("valid");
            let billing = ledger(&pool).with_table(table);
            billing.migrate().await.expect("migrate billing_events");
            billing.migrate().await.expect("migrate again");
            assert_eq!(billing.migrations_table(), "_tower_idempotency_consumer_billing_events_migrations");
            let done = billing.process_once("evt_1", record("evt_1", 1)).await;
            assert_eq!(done.expect("billing"), Outcome::Processed(1));
            let again = billing.process_once("evt_1", record("evt_1", 2)).await;
            assert_eq!(again.expect("billing again"), Outcome::Duplicate);
            let in_own_table: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_events WHERE event_id = 'evt_1'")
                .fetch_one(&pool)
                .await
                .expect("count billing_events");
            assert_eq!(in_own_table, 1);
            assert_eq!(processed_rows(&pool, "evt_1").await, 0, "the default table is untouched");
            // The default table is another set of marks: the same event is new there.
            let default = ledger(&pool).process_once("evt_1", record("evt_1", 3)).await;
            assert_eq!(default.expect("default table"), Outcome::Processed(3));
            assert!(tower_idempotency_consumer::sql::TableName::new("x; DROP TABLE effects").is_err());
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn sweep_keeps_parked_events() {
            let (pool, _) = $fresh().await;
            let ledger = ledger(&pool).with_max_attempts(std::num::NonZeroU32::MIN);
            let parked = ledger.process_once("evt_p", refuse(1)).await;
            assert!(matches!(parked, Err(Error::Parked(_))), "{parked:?}");
            let done = ledger.process_once("evt_1", record("evt_1", 1)).await;
            assert!(done.expect("processed").is_processed());
            assert_eq!(ledger.sweep(Duration::ZERO, 10).await.expect("sweep"), 1);
            assert_eq!(ledger.parked(10).await.expect("list").len(), 1, "the parked event stays");
        }
    };
}

pub(crate) use consumer_tests;
