//! Bounded capture of the guest's stdout/stderr. Keeps the last bytes (a panic message
//! comes last) and silently drops older ones, so a chatty guest can neither grow host
//! memory nor trap on a full pipe.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Largest single write the guest is offered.
const WRITE_BUDGET: usize = 64 * 1024;

#[derive(Clone)]
pub(crate) struct TailCapture {
    inner: Arc<Mutex<Tail>>,
}

struct Tail {
    buf: VecDeque<u8>,
    capacity: usize,
    dropped: u64,
}

impl TailCapture {
    pub(crate) fn new(capacity: usize) -> TailCapture {
        TailCapture {
            inner: Arc::new(Mutex::new(Tail {
                buf: VecDeque::new(),
                capacity,
                dropped: 0,
            })),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut tail = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let capacity = tail.capacity;
        let keep = &bytes[bytes.len().saturating_sub(capacity)..];
        tail.dropped += (bytes.len() - keep.len()) as u64;
        tail.buf.extend(keep);
        let excess = tail.buf.len().saturating_sub(capacity);
        tail.buf.drain(..excess);
        tail.dropped += excess as u64;
    }

    /// What was captured, lossily decoded, noting how much was dropped in front.
    pub(crate) fn text(&self) -> String {
        let tail = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (a, b) = tail.buf.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        let text = String::from_utf8_lossy(&bytes).trim().to_string();
        if tail.dropped > 0 {
            format!("[{} earlier bytes dropped] {text}", tail.dropped)
        } else {
            text
        }
    }
}

impl IsTerminal for TailCapture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailCapture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TailCapture {
    async fn ready(&mut self) {}
}

impl OutputStream for TailCapture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_BUDGET)
    }
}

impl tokio::io::AsyncWrite for TailCapture {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tail() {
        let c = TailCapture::new(8);
        c.push(b"hello ");
        assert_eq!(c.text(), "hello");
        c.push(b"world!");
        assert_eq!(c.text(), "[4 earlier bytes dropped] o world!");
        c.push(b"0123456789abcdef");
        assert_eq!(c.text(), "[20 earlier bytes dropped] 89abcdef");
    }
}
