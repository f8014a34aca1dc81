//! The request and response body types of [`IdempotencyService`](crate::IdempotencyService).

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

/// The error type of bodies the layer produces.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What both bodies' `poll_frame` answers.
type NextFrame = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

pin_project! {
    /// The request body the inner service receives: the body the layer buffered (to fingerprint
    /// it), or the caller's own body, untouched, on requests the layer lets through unread
    /// (uncovered methods, no key with [`optional`](crate::Idempotency::optional)).
    ///
    /// Any `B: http_body::Body` goes in (axum's `Body`, hyper's `Incoming`, tonic's `Body`), and
    /// this always yields [`Bytes`], so axum's `Router`, tonic services and hyper services accept
    /// it as their request body.
    pub struct RequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestKindProj]
    enum RequestKind<B> {
        Buffered { #[pin] body: Full<Bytes> },
        PassThrough { #[pin] body: B },
    }
}

impl<B> RequestBody<B> {
    /// The caller's body, passed through unread.
    pub fn new(body: B) -> Self {
        Self {
            kind: RequestKind::PassThrough { body },
        }
    }

    /// A body held whole in memory.
    pub fn buffered(bytes: impl Into<Bytes>) -> Self {
        Self {
            kind: RequestKind::Buffered {
                body: Full::new(bytes.into()),
            },
        }
    }
}

impl<B> From<Bytes> for RequestBody<B> {
    fn from(bytes: Bytes) -> Self {
        Self::buffered(bytes)
    }
}

impl<B> Body for RequestBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> NextFrame {
        match self.project().kind.project() {
            RequestKindProj::Buffered { body } => {
                body.poll_frame(cx).map_err(|never| match never {})
            }
            RequestKindProj::PassThrough { body } => body.poll_frame(cx).map(|frame| {
                frame.map(|frame| {
                    frame
                        .map(|frame| {
                            frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
                        })
                        .map_err(Into::into)
                })
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Buffered { body } => body.is_end_stream(),
            RequestKind::PassThrough { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Buffered { body } => body.size_hint(),
            RequestKind::PassThrough { body } => body.size_hint(),
        }
    }
}

impl<B> std::fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            RequestKind::Buffered { .. } => "buffered",
            RequestKind::PassThrough { .. } => "pass_through",
        };
        f.debug_struct("RequestBody").field("kind", &kind).finish()
    }
}

pin_project! {
    /// Either the inner service's body, untouched (requests the layer does not cover), or a body
    /// the layer holds whole (a buffered first answer, a replay, or the layer's own answer).
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // The layer's own answer (a rejection).
        Rejection { #[pin] body: Full<Bytes> },
        // Held whole: the data frame, then the trailers frame if any.
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        // The inner body failed while the layer read it: the client sees the same failure.
        Failed { error: Option<BoxError> },
        // Over the saved-body limit: what the layer read, then the rest of the inner body.
        Prefixed { prefix: Option<Bytes>, body: Pin<Box<B>> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn from_full(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Rejection { body },
        }
    }

    /// `bytes`, then `trailers` (none sent when empty).
    pub(crate) fn with_trailers(bytes: Bytes, trailers: HeaderMap) -> Self {
        Self {
            kind: Kind::Full {
                data: (!bytes.is_empty()).then_some(bytes),
                trailers: (!trailers.is_empty()).then_some(trailers),
            },
        }
    }

    /// `prefix`, then the rest of `body`, streamed.
    pub(crate) fn prefixed(prefix: Bytes, body: Pin<Box<B>>) -> Self {
        Self {
            kind: Kind::Prefixed {
                prefix: (!prefix.is_empty()).then_some(prefix),
                body,
            },
        }
    }

    pub(crate) fn failed(error: BoxError) -> Self {
        Self {
            kind: Kind::Failed { error: Some(error) },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> NextFrame {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Rejection { body } => body.poll_frame(cx).map_err(|never| match never {}),
            KindProj::Full { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
            KindProj::Failed { error } => Poll::Ready(error.take().map(Err)),
            KindProj::Prefixed { prefix, body } => match prefix.take() {
                Some(prefix) => Poll::Ready(Some(Ok(Frame::data(prefix)))),
                None => body.as_mut().poll_frame(cx).map_err(Into::into),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Rejection { body } => body.is_end_stream(),
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Failed { error } => error.is_none(),
            Kind::Prefixed { prefix, body } => prefix.is_none() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Rejection { body } => body.size_hint(),
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Failed { .. } => SizeHint::default(),
            Kind::Prefixed { prefix, body } => {
                let read = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let rest = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + read);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + read);
                }
                hint
            }
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Rejection { .. } => "rejection",
            Kind::Full { .. } => "full",
            Kind::Failed { .. } => "failed",
            Kind::Prefixed { .. } => "prefixed",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}
