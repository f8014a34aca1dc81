//! The response body type of [`IdempotencyService`](crate::IdempotencyService).

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

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
        Full { #[pin] body: Full<Bytes> },
        // The inner body failed while the layer read it: the client sees the same failure.
        Failed { error: Option<crate::BoxError> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(bytes: impl Into<Bytes>) -> Self {
        Self::from_full(Full::new(bytes.into()))
    }

    pub(crate) fn from_full(body: Full<Bytes>) -> Self {
        Self {
            kind: Kind::Full { body },
        }
    }

    pub(crate) fn failed(error: crate::BoxError) -> Self {
        Self {
            kind: Kind::Failed { error: Some(error) },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<crate::BoxError>,
{
    type Data = Bytes;
    type Error = crate::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Full { body } => body.poll_frame(cx).map_err(|never| match never {}),
            KindProj::Failed { error } => Poll::Ready(error.take().map(Err)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { body } => body.is_end_stream(),
            Kind::Failed { error } => error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { body } => body.size_hint(),
            Kind::Failed { .. } => SizeHint::default(),
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Full { .. } => "full",
            Kind::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseBody").field("kind", &kind).finish()
    }
}
