//! Every request to the apiserver bounded as a whole: a deadline from the moment it is sent to the last byte of
//! its answer (kube's own timeouts are idle timers, reset by every byte a trickling server sends), and a cap on
//! the answer's size (kube reads a whole answer into memory, which the daemon locks). A layer of the client's
//! service stack, so every call of every loop has it. Watches, which stream for minutes, need a client without
//! the deadline; the node side has none.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why an answer was abandoned.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    /// The deadline passed before the answer was complete.
    #[error("the apiserver's answer was not complete within {0:?}")]
    Deadline(Duration),
    /// The answer is larger than the cap.
    #[error("the apiserver's answer is larger than {0} bytes; abandoned")]
    TooLarge(usize),
}

/// The bounds of one client's requests.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// From sending the request to the answer's last byte.
    pub deadline: Duration,
    /// The most bytes an answer's body may have.
    pub max_bytes: usize,
}

impl<S> Layer<S> for Bounds {
    type Service = BoundedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundedService { inner, bounds: *self }
    }
}

/// The service of [`Bounds`].
#[derive(Debug, Clone)]
pub struct BoundedService<S> {
    inner: S,
    bounds: Bounds,
}

impl<S, Q, B> Service<Request<Q>> for BoundedService<S>
where
    S: Service<Request<Q>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<BoundedBody<B>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Q>) -> Self::Future {
        let Bounds { deadline, max_bytes } = self.bounds;
        let end = Instant::now() + deadline;
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = match tokio::time::timeout_at(end, answer).await {
                Ok(r) => r.map_err(Into::into)?,
                Err(_) => return Err(BoundError::Deadline(deadline).into()),
            };
            if let Some(len) = response.body().size_hint().exact()
                && len > max_bytes as u64
            {
                return Err(BoundError::TooLarge(max_bytes).into());
            }
            let until = Box::pin(tokio::time::sleep_until(end));
            Ok(response.map(|body| BoundedBody { inner: Box::pin(body), left: max_bytes, max_bytes, until, deadline }))
        })
    }
}

/// An answer's body that fails past the deadline or the size cap.
pub struct BoundedBody<B> {
    inner: Pin<Box<B>>,
    left: usize,
    max_bytes: usize,
    until: Pin<Box<Sleep>>,
    deadline: Duration,
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, Bytes::len);
                if len > this.left {
                    return Poll::Ready(Some(Err(BoundError::TooLarge(this.max_bytes).into())));
                }
                this.left -= len;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.until.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BoundError::Deadline(this.deadline).into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A body that yields `chunks` of `size` bytes, one every `every`.
    struct Trickle {
        chunks: usize,
        size: usize,
        every: Duration,
        next: Option<Pin<Box<Sleep>>>,
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            if self.chunks == 0 {
                return Poll::Ready(None);
            }
            let every = self.every;
            let sleep = self.next.get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.next = None;
            self.chunks -= 1;
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; self.size])))))
        }
    }

    async fn read(bounds: Bounds, body: Trickle) -> Result<usize, String> {
        let service = tower::service_fn(move |_: Request<()>| {
            let body = Trickle { next: None, ..body };
            async move { Ok::<_, Infallible>(Response::new(body)) }
        });
        let mut s = bounds.layer(service);
        let response = s.call(Request::new(())).await.map_err(|e| e.to_string())?;
        let mut body = Box::pin(response.into_body());
        let mut total = 0;
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            total += frame.map_err(|e| e.to_string())?.data_ref().map_or(0, Bytes::len);
        }
        Ok(total)
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_answer_ends_at_the_deadline_and_a_large_one_at_the_cap() {
        let bounds = Bounds { deadline: Duration::from_secs(10), max_bytes: 1000 };
        let trickle = |chunks, size, every| Trickle { chunks, size, every: Duration::from_secs(every), next: None };
        assert_eq!(read(bounds, trickle(3, 100, 2)).await, Ok(300), "within both bounds");
        // A byte every 3 s: each read resets an idle timer, not this deadline.
        let start = Instant::now();
        let err = read(bounds, trickle(25, 1, 3)).await.unwrap_err();
        assert!(err.contains("not complete within 10s"), "{err}");
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        let err = read(bounds, trickle(11, 100, 0)).await.unwrap_err();
        assert!(err.contains("larger than 1000 bytes"), "{err}");
    }
}
