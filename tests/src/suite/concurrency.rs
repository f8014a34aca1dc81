//! Concurrent attempts with one key: one execution.

use super::{flavour::Contract, *};

/// One execution; the first answer is a 201; every other answer a replay of it or a 409 (with
/// the `Retry-After` of the mode's `contract`).
fn assert_single_execution(contract: Contract, replies: &[Reply], executions: usize) {
    assert_eq!(executions, 1, "the handler ran {executions} times");
    let executed: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(executed.len(), 1, "answers not replayed: {executed:?}");
    let original = executed[0];
    for reply in replies {
        if std::ptr::eq(reply, original) {
            continue;
        }
        match reply.status {
            StatusCode::CREATED => reply.assert_replay_of(original),
            StatusCode::CONFLICT => {
                contract.assert_in_flight(reply, DEFAULT_LEASE);
            }
            other => panic!("unexpected {other}: {:?}", reply.body),
        }
    }
}

async fn concurrent_attempts<St: Store, F: Flavour<St>>(store: St, n: usize) {
    let server = serve(F::layer(store)).await;
    let replies = concurrently(n, |_| server.order("seed-key")).await;
    assert_single_execution(F::CONTRACT, &replies, server.state.executions());
    assert!(replies
        .iter()
        .all(|r| r.status == StatusCode::CONFLICT || r.execution() == 1));
    // once settled, every retry is a replay
    let original = replies
        .iter()
        .find(|r| r.status == StatusCode::CREATED && !r.replayed())
        .unwrap();
    send(server.order("seed-key"))
        .await
        .assert_replay_of(original);
    assert_eq!(server.state.executions(), 1);
}

/// 5 concurrent attempts with one key: one execution; the others replay it or get 409.
pub async fn five_concurrent_attempts_execute_once<St: Store, F: Flavour<St>>(store: St) {
    concurrent_attempts::<St, F>(store, 5).await;
}

/// 50 concurrent attempts with one key: one execution; the others replay it or get 409.
pub async fn fifty_concurrent_attempts_execute_once<St: Store, F: Flavour<St>>(store: St) {
    concurrent_attempts::<St, F>(store, 50).await;
}

/// Two app instances sharing one store, hit at once with the same keys: one execution per key.
pub async fn two_instances_execute_each_key_once<St: Store, F: Flavour<St>>(store: St) {
    const KEYS: usize = 10;
    const ATTEMPTS_PER_INSTANCE: usize = 3;
    let layer = F::layer(store);
    let a = serve(layer.clone()).await;
    let b = serve(layer).await;
    let per_key = 2 * ATTEMPTS_PER_INSTANCE;
    let replies = concurrently(KEYS * per_key, |i| {
        let key = format!("two-instances-{}", i / per_key);
        if i % 2 == 0 {
            a.order(&key)
        } else {
            b.order(&key)
        }
    })
    .await;
    for key in 0..KEYS {
        let name = format!("two-instances-{key}");
        let executions = a.state.executions_of(&name) + b.state.executions_of(&name);
        let replies = &replies[key * per_key..(key + 1) * per_key];
        assert_single_execution(F::CONTRACT, replies, executions);
    }
    assert_eq!(a.state.executions() + b.state.executions(), KEYS);
}
