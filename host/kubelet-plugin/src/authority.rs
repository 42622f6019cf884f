//! A fix-up between the kubelet's plugin watcher and the registration server.
//!
//! The kubelet dials a registration socket by its bare path, so grpc-go sends that path
//! as the request's `:authority`. A path is not a valid authority, and the HTTP/2 server
//! under tonic (h2) resets such a stream with PROTOCOL_ERROR before any service sees it
//! (hyperium/h2 has no option to accept it). The kubelet's DRA client dials `unix:` and
//! sends `localhost`, so only registration needs this.
//!
//! Each accepted connection is relayed to the server through an in-memory pipe. From the
//! kubelet to the server, every frame passes unchanged except request header blocks:
//! those are decoded (HPACK, with the kubelet's dynamic table), get `:authority:
//! localhost`, and are encoded again (with this relay's own table, the server's decoder
//! seeing only what this relay sends). The server's replies pass through untouched.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame the server accepts by default (SETTINGS_MAX_FRAME_SIZE).
const MAX_FRAME: usize = 16_384;
/// A registration request's headers are a few hundred bytes; refuse a flood.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// One pipe's buffer each way.
const PIPE: usize = 64 * 1024;

/// The connections of `listener`, each relayed with its authority fixed.
pub(crate) fn relay(listener: UnixListener) -> ReceiverStream<io::Result<DuplexStream>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            // Ends with the server (it drops the stream), closing the socket.
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let conn = match accepted {
                Ok((conn, _)) => conn,
                // Out of descriptors, say: the kubelet retries registration, so wait
                // and go on accepting rather than stop serving it for good.
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a registration connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (server_side, relay_side) = tokio::io::duplex(PIPE);
            if tx.send(Ok(server_side)).await.is_err() {
                return;
            }
            tokio::spawn(async move {
                if let Err(e) = relay_one(conn, relay_side).await {
                    tracing::debug!(error = %e, "registration connection ended");
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

async fn relay_one(conn: UnixStream, server: DuplexStream) -> io::Result<()> {
    let (mut from_kubelet, mut to_kubelet) = conn.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(server);
    let upstream = async {
        let r = forward_requests(&mut from_kubelet, &mut to_server).await;
        let _ = to_server.shutdown().await;
        r
    };
    let downstream = async {
        let r = tokio::io::copy(&mut from_server, &mut to_kubelet).await;
        let _ = to_kubelet.shutdown().await;
        r.map(|_| ())
    };
    let (up, down) = tokio::join!(upstream, downstream);
    up.and(down)
}

fn bad(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// The kubelet's side of the connection: the preface, then frames.
async fn forward_requests<R, W>(from: &mut R, to: &mut W) -> io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    if preface != PREFACE {
        return Err(bad("not an HTTP/2 connection"));
    }
    to.write_all(&preface).await?;
    let mut rewriter = Rewriter::new();
    // A header block split over CONTINUATION frames: its stream, END_STREAM, fragments.
    let mut pending: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match from.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if len > MAX_FRAME {
            return Err(bad(format!("a frame of {len} bytes")));
        }
        let mut payload = vec![0u8; len];
        from.read_exact(&mut payload).await?;
        match kind {
            HEADERS => {
                if pending.is_some() {
                    return Err(bad("HEADERS inside a header block"));
                }
                let fragment = header_fragment(&payload, flags)?;
                pending = Some((stream, flags & END_STREAM, fragment.to_vec()));
            }
            CONTINUATION => match &mut pending {
                Some((s, _, block)) if *s == stream => {
                    block.extend_from_slice(&payload);
                }
                _ => return Err(bad("CONTINUATION outside a header block")),
            },
            _ => {
                if pending.is_some() {
                    return Err(bad("a frame inside a header block"));
                }
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        }
        if flags & END_HEADERS == 0 {
            if pending
                .as_ref()
                .is_some_and(|(_, _, b)| b.len() > MAX_HEADER_BLOCK)
            {
                return Err(bad("a header block over 64 KiB"));
            }
            continue;
        }
        if let Some((stream, end_stream, block)) = pending.take() {
            let block = rewriter.rewrite(&block)?;
            if block.len() > MAX_FRAME {
                return Err(bad("a rewritten header block over one frame"));
            }
            to.write_all(&frame_head(
                block.len(),
                HEADERS,
                END_HEADERS | end_stream,
                stream,
            ))
            .await?;
            to.write_all(&block).await?;
        }
    }
}

/// A HEADERS frame's block fragment, without its padding and priority fields.
fn header_fragment(payload: &[u8], flags: u8) -> io::Result<&[u8]> {
    let mut body = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        let (&n, rest) = body
            .split_first()
            .ok_or_else(|| bad("an empty padded frame"))?;
        pad = usize::from(n);
        body = rest;
    }
    if flags & PRIORITY != 0 {
        body = body.get(5..).ok_or_else(|| bad("a short priority field"))?;
    }
    body.get(
        ..body
            .len()
            .checked_sub(pad)
            .ok_or_else(|| bad("padding past the frame"))?,
    )
    .ok_or_else(|| bad("padding past the frame"))
}

fn frame_head(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

/// Decodes the kubelet's header blocks and encodes them again with a valid authority.
struct Rewriter {
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
}

impl Rewriter {
    fn new() -> Self {
        Self {
            decoder: loona_hpack::Decoder::new(),
            encoder: loona_hpack::Encoder::new(),
        }
    }

    fn rewrite(&mut self, block: &[u8]) -> io::Result<Vec<u8>> {
        let headers = self
            .decoder
            .decode(block)
            .map_err(|e| bad(format!("a header block HPACK cannot decode: {e:?}")))?;
        let fixed: Vec<(&[u8], &[u8])> = headers
            .iter()
            .map(|(name, value)| {
                if name.as_slice() == b":authority" {
                    (name.as_slice(), b"localhost".as_slice())
                } else {
                    (name.as_slice(), value.as_slice())
                }
            })
            .collect();
        Ok(self.encoder.encode(fixed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authority_is_replaced_and_everything_else_kept() {
        let mut kubelet = loona_hpack::Encoder::new();
        let mut rewriter = Rewriter::new();
        let mut server = loona_hpack::Decoder::new();
        // Twice: the second block leans on both dynamic tables.
        for _ in 0..2 {
            let block = kubelet.encode([
                (b":method".as_slice(), b"POST".as_slice()),
                (b":path", b"/pluginregistration.Registration/GetInfo"),
                (
                    b":authority",
                    b"/var/lib/kubelet/plugins_registry/x-reg.sock",
                ),
                (b"content-type", b"application/grpc"),
            ]);
            let fixed = server.decode(&rewriter.rewrite(&block).unwrap()).unwrap();
            let as_text: Vec<(String, String)> = fixed
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            assert_eq!(
                as_text,
                [
                    (":method", "POST"),
                    (":path", "/pluginregistration.Registration/GetInfo"),
                    (":authority", "localhost"),
                    ("content-type", "application/grpc"),
                ]
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
            );
        }
    }

    #[test]
    fn padding_and_priority_are_stripped_and_lies_refused() {
        let payload = [2u8, 1, 2, 3, 4, 5, 0xaa, 0xbb, 0, 0];
        assert_eq!(
            header_fragment(&payload, PADDED | PRIORITY).unwrap(),
            [0xaa, 0xbb]
        );
        assert!(header_fragment(&[9u8, 1], PADDED).is_err());
        assert!(header_fragment(&[1u8], PRIORITY).is_err());
        assert!(Rewriter::new().rewrite(&[0xff, 0xff, 0xff]).is_err());
    }
}
