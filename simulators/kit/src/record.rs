//! The record kept of every request a simulator receives.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use serde_json::Value;

use crate::lock;

/// One request as the simulator received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest<R> {
    /// Arrival order, from 1.
    pub seq: u64,
    /// Arrival time on the simulator's clock.
    pub at: SystemTime,
    /// Arrival time on the system's clock, whatever the simulator's clock says: what
    /// times other processes wrote (a Lease's renewal) are compared with.
    pub wall: SystemTime,
    /// The client's address (its side of the connection).
    pub peer: SocketAddr,
    /// Who the client is, as the caller resolver said when its connection was accepted
    /// or, failing that, at this request ([`crate::Controls::set_caller_resolver`]);
    /// None without one, or when it did not know the client.
    pub caller: Option<String>,
    /// Came in over HTTPS.
    pub tls: bool,
    pub method: String,
    /// Path without the query.
    pub path: String,
    pub query: Option<String>,
    pub route: Option<R>,
    /// All headers, names lower-case, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl<R> RecordedRequest<R> {
    /// First header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The token of an `Authorization: Bearer` header.
    pub fn bearer(&self) -> Option<&str> {
        bearer_token(self.header("authorization")?)
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as form fields (token requests).
    pub fn form(&self) -> Vec<(String, String)> {
        form_urlencoded::parse(&self.body).into_owned().collect()
    }

    pub fn form_value(&self, key: &str) -> Option<String> {
        self.form()
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn query_param(&self, key: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_deref()?.as_bytes())
            .into_owned()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// The token of a `Bearer <token>` header value (scheme case-insensitive).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Every request received, in arrival order, each numbered.
pub struct RequestLog<R> {
    records: Mutex<Vec<RecordedRequest<R>>>,
    next_seq: AtomicU64,
}

impl<R> Default for RequestLog<R> {
    fn default() -> Self {
        RequestLog {
            records: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(1),
        }
    }
}

impl<R: Clone + PartialEq> RequestLog<R> {
    /// Appends `req` under the next sequence number (its own `seq` is ignored).
    pub fn record(&self, mut req: RecordedRequest<R>) {
        let mut records = lock(&self.records);
        // Numbered under the lock, so arrival order and numbering agree.
        req.seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        records.push(req);
    }

    pub fn all(&self) -> Vec<RecordedRequest<R>> {
        lock(&self.records).clone()
    }

    pub fn to(&self, route: &R) -> Vec<RecordedRequest<R>> {
        lock(&self.records)
            .iter()
            .filter(|r| r.route.as_ref() == Some(route))
            .cloned()
            .collect()
    }

    /// The sequence number of the newest request recorded (0: none yet, or cleared).
    pub fn last_seq(&self) -> u64 {
        lock(&self.records).last().map_or(0, |r| r.seq)
    }

    /// Whether a request to one of `routes` came after request `seq` and satisfies
    /// `pred`. Looks only at the requests after `seq` and copies none.
    pub fn any_since(
        &self,
        seq: u64,
        routes: &[R],
        pred: impl Fn(&RecordedRequest<R>) -> bool,
    ) -> bool {
        lock(&self.records)
            .iter()
            .rev()
            .take_while(|r| r.seq > seq)
            .any(|r| r.route.as_ref().is_some_and(|route| routes.contains(route)) && pred(r))
    }

    /// `f` of each request after request `seq`, in arrival order, copying none: a view
    /// of a few fields of a long log costs no copy of its bodies.
    pub fn map_since<T>(&self, seq: u64, f: impl FnMut(&RecordedRequest<R>) -> T) -> Vec<T> {
        let records = lock(&self.records);
        // Numbers grow in arrival order, so the requests after `seq` are a suffix.
        let start = records.partition_point(|r| r.seq <= seq);
        records[start..].iter().map(f).collect()
    }

    pub fn clear(&self) {
        lock(&self.records).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(route: Option<u8>, body: &str) -> RecordedRequest<u8> {
        RecordedRequest {
            seq: 0,
            at: SystemTime::UNIX_EPOCH,
            wall: SystemTime::UNIX_EPOCH,
            peer: SocketAddr::from(([127, 0, 0, 1], 40000)),
            caller: None,
            tls: false,
            method: "POST".into(),
            path: "/x".into(),
            query: Some("a=1&b=two".into()),
            route,
            headers: vec![("authorization".into(), "Bearer tok".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }

    #[test]
    fn log_numbers_filters_and_clears() {
        let log = RequestLog::default();
        log.record(req(Some(1), "grant_type=password&username=u"));
        log.record(req(Some(2), "{\"a\": 1}"));
        log.record(req(None, ""));
        assert_eq!(log.last_seq(), 3);
        let to_one = log.to(&1);
        assert_eq!(to_one.len(), 1);
        assert_eq!(to_one[0].seq, 1);
        assert_eq!(to_one[0].form_value("username").as_deref(), Some("u"));
        assert_eq!(to_one[0].query_param("b").as_deref(), Some("two"));
        assert_eq!(to_one[0].bearer(), Some("tok"));
        assert_eq!(log.all()[1].json(), Some(serde_json::json!({"a": 1})));
        assert!(log.any_since(1, &[2], |r| r.json().is_some()));
        assert!(!log.any_since(2, &[2], |_| true));
        assert_eq!(log.map_since(1, |r| r.seq), vec![2, 3]);
        assert_eq!(log.map_since(0, |r| r.route), vec![Some(1), Some(2), None]);
        assert!(log.map_since(3, |r| r.seq).is_empty());
        log.clear();
        assert_eq!(log.last_seq(), 0);
    }
}
