//! Wait-mode notifications: one pub/sub connection shared by the clones of a store.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use futures_util::StreamExt;
use redis::RedisResult;
use tokio::sync::{oneshot, Notify};

/// Wait-mode notifications: one pub/sub connection, a [`Notify`] per channel with waiters.
pub(super) struct Notifier {
    client: redis::Client,
    waiters: Arc<Mutex<HashMap<String, Waiters>>>,
    /// The live connection. Also serialises `SUBSCRIBE` and `UNSUBSCRIBE`, so that an
    /// unsubscribe for a channel that lost its last waiter cannot overtake a new subscribe.
    link: tokio::sync::Mutex<Option<Link>>,
}

struct Waiters {
    notify: Arc<Notify>,
    count: usize,
}

/// A pub/sub connection and the task dispatching its messages.
struct Link {
    sink: redis::aio::PubSubSink,
    /// Dropping it stops the dispatch task, which drops the stream and closes the connection.
    _stop: oneshot::Sender<()>,
}

/// One waiter's interest in a channel; the channel is unsubscribed when the last one drops.
pub(super) struct Registration {
    notifier: Arc<Notifier>,
    channel: String,
    pub(super) notify: Arc<Notify>,
}

fn lock(waiters: &Mutex<HashMap<String, Waiters>>) -> MutexGuard<'_, HashMap<String, Waiters>> {
    // The map stays consistent whatever panicked while holding the lock.
    waiters
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Notifier {
    pub(super) fn new(client: redis::Client) -> Self {
        Self {
            client,
            waiters: Arc::default(),
            link: tokio::sync::Mutex::new(None),
        }
    }

    pub(super) fn register(this: &Arc<Self>, channel: &str) -> Registration {
        let mut waiters = lock(&this.waiters);
        let entry = waiters
            .entry(channel.to_owned())
            .or_insert_with(|| Waiters {
                notify: Arc::new(Notify::new()),
                count: 0,
            });
        entry.count += 1;
        Registration {
            notifier: Arc::clone(this),
            channel: channel.to_owned(),
            notify: Arc::clone(&entry.notify),
        }
    }

    /// Subscribe to `channel`, opening the connection if there is none (or it died).
    pub(super) async fn subscribe(&self, channel: &str) -> RedisResult<()> {
        let mut link = self.link.lock().await;
        let mut retried = false;
        loop {
            let current = match link.as_mut() {
                Some(current) => current,
                None => link.insert(self.open().await?),
            };
            match current.sink.subscribe(channel).await {
                Ok(()) => return Ok(()),
                Err(err) => {
                    *link = None;
                    if retried {
                        return Err(err);
                    }
                    retried = true;
                }
            }
        }
    }

    async fn open(&self) -> RedisResult<Link> {
        let (sink, mut stream) = self.client.get_async_pubsub().await?.split();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let waiters = Arc::clone(&self.waiters);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = stream.next() => match message {
                        Some(message) => {
                            if let Some(entry) = lock(&waiters).get(message.get_channel_name()) {
                                entry.notify.notify_waiters();
                            }
                        }
                        None => break,
                    },
                    _ = &mut stopped => break,
                }
            }
            // The connection is gone: wake everyone so that they claim again (and resubscribe
            // on a new connection if they still have to wait).
            for entry in lock(&waiters).values() {
                entry.notify.notify_waiters();
            }
        });
        Ok(Link { sink, _stop: stop })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let last = {
            let mut waiters = lock(&self.notifier.waiters);
            match waiters.get_mut(&self.channel) {
                Some(entry) if entry.count > 1 => {
                    entry.count -= 1;
                    false
                }
                Some(_) => {
                    waiters.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let notifier = Arc::clone(&self.notifier);
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let mut link = notifier.link.lock().await;
            // A waiter that registered meanwhile has subscribed (or will, after this lock).
            if lock(&notifier.waiters).contains_key(&channel) {
                return;
            }
            if let Some(current) = link.as_mut() {
                if current.sink.unsubscribe(&channel).await.is_err() {
                    *link = None;
                }
            }
        });
    }
}
