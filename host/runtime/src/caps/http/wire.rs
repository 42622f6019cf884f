//! The provider's connections, fenced at the socket: every write to a provider's TCP
//! connection (TLS records included, since TLS runs on top of it) asks the gate's fence
//! first, and a refused write fails the connection without a byte leaving.
//!
//! Why at the socket: the request-level check in `egress` runs before the client's own
//! work (a pooled connection handed over, or a new one connected and its TLS handshake
//! done, then the write on the connection's task). A process paused in that stretch
//! (SIGSTOP, a long GC-like stall of the node) and resumed after its Lease moved would
//! send a request checked under the old Lease. Here nothing but the write system call
//! lies after the check.
//!
//! One connector per provider (it carries that provider's gate), used by the provider's
//! own pooled `hyper` client.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::gate::Gate;

/// A write the fence refused, found again in the error's source chain: the request was
/// not sent (or not whole: a server never acts on a request cut off mid-way).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct WriteFenced(pub(crate) String);

/// Connects a provider's requests: TCP (no Nagle: a request is one write and waits on
/// its reply), TLS for `https` with the provider's trust roots, writes fenced.
#[derive(Clone)]
pub(crate) struct FencedConnector {
    tls: TlsConnector,
    gate: Arc<Gate>,
}

impl FencedConnector {
    pub(crate) fn new(tls: Arc<rustls::ClientConfig>, gate: Arc<Gate>) -> FencedConnector {
        FencedConnector {
            tls: TlsConnector::from(tls),
            gate,
        }
    }

    async fn connect(self, uri: Uri) -> io::Result<TokioIo<Wire>> {
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        let host = uri.host().ok_or_else(|| invalid("no host in the URL"))?;
        // `Uri::host` keeps an IPv6 literal's brackets; the resolver and TLS want it bare.
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("only http and https URLs")),
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        let socket = FencedTcp {
            tcp,
            gate: self.gate.clone(),
        };
        let wire = if https {
            let name = ServerName::try_from(host)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Wire::Tls(Box::new(self.tls.connect(name, socket).await?))
        } else {
            Wire::Plain(socket)
        };
        Ok(TokioIo::new(wire))
    }
}

impl tower_service::Service<Uri> for FencedConnector {
    type Response = TokioIo<Wire>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<Wire>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// A provider's TCP connection whose writes ask the fence first.
pub(crate) struct FencedTcp {
    tcp: TcpStream,
    gate: Arc<Gate>,
}

impl FencedTcp {
    fn fence(&self) -> io::Result<()> {
        self.gate
            .fence_allows()
            .map_err(|reason| io::Error::new(io::ErrorKind::PermissionDenied, WriteFenced(reason)))
    }
}

impl AsyncRead for FencedTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for FencedTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.fence()?;
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.fence()?;
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// A provider's connection as the HTTP client sees it: plain or TLS, over [`FencedTcp`].
pub(crate) enum Wire {
    Plain(FencedTcp),
    Tls(Box<TlsStream<FencedTcp>>),
}

impl Connection for Wire {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Wire::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Wire::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Wire::Plain(s) => s.is_write_vectored(),
            Wire::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Plain(s) => Pin::new(s).poll_flush(cx),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Wire::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
