//! A minimal HTTP/1.1 client over a plain TCP stream: enough to POST JSON to the test's
//! stand-in service on loopback. One request per connection (`Connection: close`), a
//! body sized by `Content-Length`; a chunked reply is decoded too, in case a server
//! streams one.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long connecting may take: the service is on loopback, so either it answers at
/// once or it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Replies larger than this are refused (nvidia-smi's answers are a few lines).
const MAX_REPLY: u64 = 16 << 20;

/// `http://host:port[/base]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// A path prefix without its trailing slash ("" for none).
    pub base: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("{s:?} is not an http:// URL"))?;
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| format!("{s:?} has a bad port {p:?}"))?,
            ),
            None => (authority, 80),
        };
        if host.is_empty() {
            return Err(format!("{s:?} has no host"));
        }
        Ok(Url {
            host: host.to_owned(),
            port,
            base: base.to_owned(),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The bytes of a POST of `body` as JSON to `path` under `url`.
pub fn post_request(url: &Url, path: &str, body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "POST {}{} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        url.base,
        path,
        url.host,
        url.port,
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    req
}

/// POSTs `body` and waits up to `read_timeout` for the whole reply.
pub fn post_json(
    url: &Url,
    path: &str,
    body: &[u8],
    read_timeout: Duration,
) -> Result<Response, String> {
    let addrs = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {}: {e}", url.host))?;
    let mut last = format!("{} resolves to no address", url.host);
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("connecting to {addr}: {e}"),
        }
    }
    let mut stream = stream.ok_or(last)?;
    let io = |e: std::io::Error| format!("talking to {}:{}: {e}", url.host, url.port);
    stream.set_read_timeout(Some(read_timeout)).map_err(io)?;
    stream
        .set_write_timeout(Some(CONNECT_TIMEOUT))
        .map_err(io)?;
    stream
        .write_all(&post_request(url, path, body))
        .map_err(io)?;
    let mut raw = Vec::new();
    // The server closes the connection after its reply (we asked it to).
    (&mut stream)
        .take(MAX_REPLY)
        .read_to_end(&mut raw)
        .map_err(io)?;
    parse_response(&raw)
}

/// Parses a whole HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the reply ended inside its headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "the reply's headers are not text")?;
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        rest.get(..n)
            .ok_or_else(|| format!("the reply ended after {} of {n} bytes", rest.len()))?
            .to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunked reply ended inside a chunk size")?;
        let size_text = std::str::from_utf8(&data[..eol]).map_err(|_| "bad chunk size")?;
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = data
            .get(..size)
            .ok_or("a chunked reply ended inside a chunk")?;
        out.extend_from_slice(chunk);
        data = data.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            Url::parse("http://127.0.0.1:4567"),
            Ok(Url {
                host: "127.0.0.1".into(),
                port: 4567,
                base: String::new()
            })
        );
        assert_eq!(
            Url::parse("http://localhost:80/standin/").map(|u| u.base),
            Ok("/standin".into())
        );
        assert_eq!(Url::parse("http://h").map(|u| u.port), Ok(80));
        assert!(Url::parse("https://127.0.0.1:1").is_err());
        assert!(Url::parse("http://127.0.0.1:x").is_err());
        assert!(Url::parse("http://:1").is_err());
    }

    #[test]
    fn request_bytes() {
        let url = Url::parse("http://127.0.0.1:9/b").unwrap();
        let req = String::from_utf8(post_request(&url, "/v1/exec", b"{}")).unwrap();
        assert!(req.starts_with("POST /b/v1/exec HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"));
        assert!(req.contains("\r\nContent-Length: 2\r\n"));
        assert!(req.contains("\r\nConnection: close\r\n"));
        assert!(req.ends_with("\r\n\r\n{}"));
    }

    #[test]
    fn responses() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!((r.status, r.text()), (200, "{}".into()));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.text(), "abcde");
        let r = parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nno such endpoint").unwrap();
        assert_eq!((r.status, r.text()), (404, "no such endpoint".into()));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn posts_over_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0; 4096];
            let mut got = Vec::new();
            while !got.ends_with(b"{\"a\":1}") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndone")
                .unwrap();
            String::from_utf8(got).unwrap()
        });
        let url = Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let r = post_json(&url, "/v1/x", b"{\"a\":1}", Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.text()), (200, "done".into()));
        assert!(
            server
                .join()
                .unwrap()
                .starts_with("POST /v1/x HTTP/1.1\r\n")
        );
    }
}
