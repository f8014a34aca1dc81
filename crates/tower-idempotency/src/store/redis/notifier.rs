//! Wait-mode notifications: one pub/sub connection shared by the clones of a store.

use std::sync::Arc;

use futures_util::StreamExt;
use redis::RedisResult;
use tokio::sync::{oneshot, Notify};

use crate::store::waiters::{Waiter, Waiters};

/// Wait-mode notifications: one pub/sub connection, a [`Notify`] per channel with waiters.
pub(super) struct Notifier {
    client: redis::Client,
    waiters: Arc<Waiters<String>>,
    /// The live connection. Also serialises `SUBSCRIBE` and `UNSUBSCRIBE`, so that an
    /// unsubscribe for a channel that lost its last waiter cannot overtake a new subscribe.
    link: tokio::sync::Mutex<Option<Link>>,
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
    waiter: Option<Waiter<String>>,
}

impl Registration {
    /// Woken when the channel carries a message, or when the connection is lost.
    pub(super) fn notify(&self) -> &Notify {
        &self.waiter.as_ref().expect("present until drop").notify
    }
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
        Registration {
            notifier: Arc::clone(this),
            waiter: Some(this.waiters.register(channel.to_owned())),
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
                            waiters.wake(&message.get_channel_name().to_owned());
                        }
                        None => break,
                    },
                    _ = &mut stopped => break,
                }
            }
            // The connection is gone: wake everyone so that they claim again (and resubscribe
            // on a new connection if they still have to wait).
            waiters.wake_all();
        });
        Ok(Link { sink, _stop: stop })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let Some(channel) = self.waiter.take().and_then(Waiter::unregister) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let notifier = Arc::clone(&self.notifier);
        runtime.spawn(async move {
            let mut link = notifier.link.lock().await;
            // A waiter that registered meanwhile has subscribed (or will, after this lock).
            if notifier.waiters.is_watched(&channel) {
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
