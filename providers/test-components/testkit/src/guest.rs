//! The component glue: bindings and the per-mode behaviour.

use std::io::Write;

use crate::modes::{self, FakeDevice};

wit_bindgen::generate!({
    path: "../../../wit/since_v0.1.0",
    world: "provider-world",
});

use cro::provider::types::{
    AddOutcome, AttachedDevice, ComposableResource, DeviceInfo, DeviceType, ProviderError,
    RemoveOutcome,
};
use cro::provider::{config, http, log, lookup, secrets, state};
use exports::cro::provider::provider::Guest;

struct Testkit;

export!(Testkit);

thread_local! {
    /// This call's config overrides from the resource model.
    static OVERRIDES: std::cell::RefCell<Vec<(String, String)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn mode_for(model: Option<&str>) -> String {
    let overrides = model
        .and_then(modes::parse_model)
        .map(|(_, o)| {
            o.into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .unwrap_or_default();
    OVERRIDES.with(|o| *o.borrow_mut() = overrides);
    let configured = config::get("mode");
    modes::select(model, configured.as_deref()).to_string()
}

impl Guest for Testkit {
    fn add_resource(resource: ComposableResource) -> Result<AddOutcome, ProviderError> {
        match mode_for(Some(&resource.model)).as_str() {
            "fake" => fake::add(&resource),
            mode => run(mode).map(|result| {
                AddOutcome::Attached(AttachedDevice {
                    device_id: result,
                    fabric_device_id: mode.to_string(),
                })
            }),
        }
    }

    fn remove_resource(resource: ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        match mode_for(Some(&resource.model)).as_str() {
            "fake" => fake::remove(&resource),
            mode => run(mode).map(|_| RemoveOutcome::Removed),
        }
    }

    fn check_resource(resource: ComposableResource) -> Result<(), ProviderError> {
        match mode_for(Some(&resource.model)).as_str() {
            "fake" => fake::check(&resource),
            mode => run(mode).map(|_| ()),
        }
    }

    fn get_resources() -> Result<Vec<DeviceInfo>, ProviderError> {
        match mode_for(None).as_str() {
            "fake" => fake::list(),
            "alias-return" => Ok(hostile::aliased_devices()),
            mode => run(mode).map(|_| Vec::new()),
        }
    }
}

fn cfg(key: &str) -> Option<String> {
    let overridden = OVERRIDES.with(|o| {
        o.borrow()
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    });
    overridden.or_else(|| config::get(key))
}

fn cfg_or(key: &str, default: &str) -> String {
    cfg(key).unwrap_or_else(|| default.to_string())
}

fn run(mode: &str) -> Result<String, ProviderError> {
    match mode {
        "loop" => spin(),
        "sleep" => {
            let secs = cfg("secs").and_then(|s| s.parse().ok()).unwrap_or(3600);
            std::thread::sleep(std::time::Duration::from_secs(secs));
            Ok(format!("slept {secs}s"))
        }
        "membomb" => membomb(),
        "trap" => trap(),
        "exit" => std::process::exit(3),
        "http" | "sleep-http" => send_http(),
        "secret" => read_secret(),
        "lookup" => do_lookup(),
        "config" => Ok(format!(
            "{}|{}",
            cfg("key")
                .and_then(|k| config::get(&k))
                .unwrap_or_else(|| "<none>".into()),
            config::entries().len()
        )),
        "log" => {
            let message = cfg_or("message", "testkit log");
            for level in [
                log::Level::Trace,
                log::Level::Debug,
                log::Level::Info,
                log::Level::Warn,
                log::Level::Error,
            ] {
                log::log(level, &message);
            }
            Ok("logged".into())
        }
        "state" => use_state(),
        "wasi-fs" => wasi_fs(),
        "wasi-env" => Ok(format!(
            "vars={} args={}",
            std::env::vars_os().count(),
            std::env::args_os().count()
        )),
        "wasi-clock" => wasi_clock(),
        "wasi-socket" => wasi_socket(),
        "log-loop" => hostile::log_loop(),
        "deny-big" => hostile::deny_big(),
        "read-loop" => hostile::read_loop(),
        "alias-send" => hostile::aliased_headers(),
        "http-loop" => hostile::http_loop(),
        "pollables" => hostile::pollables(),
        "big-error" => hostile::big_error(),
        "state-fill" => hostile::state_fill(),
        other => Err(ProviderError::Config(format!(
            "unknown testkit mode `{other}`"
        ))),
    }
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn membomb() -> ! {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = vec![0u8; 1 << 20];
        // Touch every page so the memory is really committed on the host.
        for i in (0..block.len()).step_by(4096) {
            block[i] = 1;
        }
        blocks.push(std::hint::black_box(block));
    }
}

/// The `trap` mode: panicking is the whole point, so the host's trap handling and the
/// captured stderr (bounded by `noise_bytes` of filler) can be tested.
fn trap() -> ! {
    let noise: usize = cfg("noise_bytes").and_then(|n| n.parse().ok()).unwrap_or(0);
    if noise > 0 {
        let chunk = vec![b'.'; 1024];
        let mut stderr = std::io::stderr();
        let mut left = noise;
        while left > 0 {
            let n = left.min(chunk.len());
            let _ = stderr.write_all(&chunk[..n]);
            left -= n;
        }
        let _ = stderr.write_all(b"\n");
    }
    panic!("{}", cfg_or("message", "testkit trap"));
}

/// The `http` mode's request, from config `url`, `method`, `headers`, `body`, `timeout_ms`.
fn http_request() -> Result<http::Request, ProviderError> {
    let url = cfg("url").ok_or_else(|| ProviderError::Config("config `url` is missing".into()))?;
    let method = match cfg_or("method", "GET").to_ascii_uppercase().as_str() {
        "GET" => http::Method::Get,
        "HEAD" => http::Method::Head,
        "POST" => http::Method::Post,
        "PUT" => http::Method::Put,
        "PATCH" => http::Method::Patch,
        "DELETE" => http::Method::Delete,
        other => return Err(ProviderError::Config(format!("bad method {other}"))),
    };
    let timeout_ms = cfg("timeout_ms").and_then(|t| t.parse().ok());
    let mut headers = vec![("x-testkit".to_string(), "1".to_string())];
    // `name: value|name: value`
    for pair in cfg_or("headers", "").split('|').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once(':').unwrap_or((pair, ""));
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(http::Request {
        method,
        url,
        headers,
        body: cfg("body").unwrap_or_default().into_bytes(),
        timeout_ms,
    })
}

fn send_http() -> Result<String, ProviderError> {
    let request = http_request()?;
    match http::send(&request) {
        Ok(response) => Ok(format!(
            "{} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        )),
        Err(http::HttpError::Denied(m)) => Err(ProviderError::Denied(m)),
        Err(http::HttpError::Timeout) => Err(ProviderError::Unavailable("http timeout".into())),
        Err(http::HttpError::Connect(m)) => {
            Err(ProviderError::Unavailable(format!("connect: {m}")))
        }
        Err(http::HttpError::Tls(m)) => Err(ProviderError::Unavailable(format!("tls: {m}"))),
        Err(http::HttpError::TooLarge(n)) => Err(ProviderError::MalformedReply(format!(
            "reply too large: {n}"
        ))),
        Err(http::HttpError::InvalidRequest(m)) => Err(ProviderError::Config(m)),
        Err(http::HttpError::Other(m)) => Err(ProviderError::Other(m)),
    }
}

fn read_secret() -> Result<String, ProviderError> {
    let key = cfg_or("key", "password");
    secrets::get(&key).map_err(|e| match e {
        secrets::SecretError::Denied(m) => ProviderError::Denied(m),
        secrets::SecretError::NotFound(m) => ProviderError::NotFound(m),
        secrets::SecretError::Other(m) => ProviderError::Other(m),
    })
}

fn lookup_error(e: lookup::LookupError) -> ProviderError {
    match e {
        lookup::LookupError::Denied(m) => ProviderError::Denied(m),
        lookup::LookupError::NotFound(m) => ProviderError::NotFound(m),
        lookup::LookupError::Other(m) => ProviderError::Other(m),
    }
}

fn do_lookup() -> Result<String, ProviderError> {
    match cfg_or("what", "node").as_str() {
        "node" => lookup::get_node(&cfg_or("name", "")).map_err(lookup_error),
        // One JSON array, on one line: the result comes back as a device id, and the
        // host refuses an id holding a newline.
        "nodes" => lookup::list_nodes()
            .map(|nodes| format!("[{}]", nodes.join(",")))
            .map_err(lookup_error),
        "object" => lookup::get_object(
            &cfg_or("api_version", "v1"),
            &cfg_or("kind", "Node"),
            cfg("namespace").as_deref(),
            &cfg_or("name", ""),
        )
        .map_err(lookup_error),
        other => Err(ProviderError::Config(format!("bad lookup `{other}`"))),
    }
}

fn use_state() -> Result<String, ProviderError> {
    let key = cfg_or("key", "blob");
    match cfg_or("op", "set").as_str() {
        "get" => state::get(&key)
            .map(|v| v.len().to_string())
            .ok_or_else(|| ProviderError::NotFound(format!("state key {key} is absent"))),
        _ => {
            let bytes: usize = cfg("bytes").and_then(|b| b.parse().ok()).unwrap_or(16);
            let ttl = cfg("ttl_ms").and_then(|t| t.parse().ok());
            if state::set(&key, &vec![b'x'; bytes], ttl) {
                Ok("stored".into())
            } else {
                Err(ProviderError::Other("state refused the value".into()))
            }
        }
    }
}

fn wasi_fs() -> Result<String, ProviderError> {
    let attempts = [
        (
            "read /etc/passwd",
            std::fs::read_to_string("/etc/passwd").map(|s| s.len().to_string()),
        ),
        (
            "list /",
            std::fs::read_dir("/").map(|d| d.count().to_string()),
        ),
        (
            "list .",
            std::fs::read_dir(".").map(|d| d.count().to_string()),
        ),
        (
            "create /tmp/cro-testkit",
            std::fs::write("/tmp/cro-testkit", b"x").map(|()| "ok".into()),
        ),
    ];
    let report = attempts
        .iter()
        .map(|(what, r)| format!("{what}: {r:?}"))
        .collect::<Vec<_>>()
        .join("; ");
    if attempts.iter().any(|(_, r)| r.is_ok()) {
        Ok(report)
    } else {
        Err(ProviderError::Denied(report))
    }
}

fn wasi_clock() -> Result<String, ProviderError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(now.to_string())
}

fn wasi_socket() -> Result<String, ProviderError> {
    use std::net::ToSocketAddrs;
    let addr = cfg_or("addr", "127.0.0.1:9");
    let tcp = std::net::TcpStream::connect(addr.as_str()).map(|_| "connected".to_string());
    let udp = std::net::UdpSocket::bind("0.0.0.0:0").map(|_| "bound".to_string());
    let dns = "localhost:80"
        .to_socket_addrs()
        .map(|a| format!("{} addresses", a.count()));
    let report = format!("tcp {addr}: {tcp:?}; udp bind: {udp:?}; dns: {dns:?}");
    if tcp.is_ok() || udp.is_ok() || dns.is_ok() {
        Ok(report)
    } else {
        Err(ProviderError::Denied(report))
    }
}

/// Modes that try to make the host spend without bound; see the crate docs.
mod hostile {
    use super::*;

    fn count(default: usize) -> usize {
        cfg("count").and_then(|n| n.parse().ok()).unwrap_or(default)
    }

    fn size(default: usize) -> usize {
        cfg("size").and_then(|n| n.parse().ok()).unwrap_or(default)
    }

    /// Holds `count` WASI pollables at once (each a host-side resource handle).
    pub fn pollables() -> Result<String, ProviderError> {
        let n = count(100_000);
        let held: Vec<_> = (0..n)
            .map(|_| wasip2::clocks::monotonic_clock::subscribe_duration(1_000_000_000))
            .collect();
        Ok(format!("held {} pollables", held.len()))
    }

    /// Logs config `message` (or `size` bytes of `x`) `count` times.
    pub fn log_loop() -> Result<String, ProviderError> {
        let message = cfg("message").unwrap_or_else(|| "x".repeat(size(64)));
        let n = count(1_000_000);
        for _ in 0..n {
            log::log(log::Level::Info, &message);
        }
        Ok(format!("logged {n}"))
    }

    /// Asks `count` times for ungranted things named with `size`-byte strings; returns
    /// the last denials.
    pub fn deny_big() -> Result<String, ProviderError> {
        let big = "a".repeat(size(1 << 20));
        let mut last = Vec::new();
        for _ in 0..count(20) {
            last.clear();
            let request = http::Request {
                method: http::Method::Get,
                url: format!("http://{big}.example/"),
                headers: Vec::new(),
                body: Vec::new(),
                timeout_ms: None,
            };
            if let Err(http::HttpError::Denied(m)) = http::send(&request) {
                last.push(m);
            }
            if let Err(secrets::SecretError::Denied(m)) = secrets::get(&big) {
                last.push(m);
            }
            if let Err(lookup::LookupError::Denied(m)) = lookup::get_object("v1", &big, None, "x") {
                last.push(m);
            }
            if let Err(lookup::LookupError::Denied(m)) = lookup::get_node(&big) {
                last.push(m);
            }
        }
        Err(ProviderError::Denied(last.join(" | ")))
    }

    /// Reads config `what` (`secret`, `node`, `nodes`) `count` times.
    pub fn read_loop() -> Result<String, ProviderError> {
        let what = cfg_or("what", "secret");
        let name = cfg_or("name", "worker-0");
        let key = cfg_or("key", "password");
        let mut ok = 0;
        for _ in 0..count(20_000) {
            let good = match what.as_str() {
                "secret" => secrets::get(&key).is_ok(),
                "node" => lookup::get_node(&name).is_ok(),
                "nodes" => lookup::list_nodes().is_ok(),
                other => return Err(ProviderError::Config(format!("bad read `{other}`"))),
            };
            ok += usize::from(good);
        }
        Ok(format!("{ok} reads"))
    }

    /// `count` strings that all point at the same `size` bytes of guest memory.
    ///
    /// # Safety of the trick
    /// The copies alias one buffer; they are never dropped (the vector is forgotten), so
    /// the buffer is freed at most once — by nobody: the instance ends with the call.
    fn aliases(n: usize, len: usize) -> Vec<String> {
        let text = std::mem::ManuallyDrop::new("y".repeat(len));
        let (ptr, cap) = (text.as_ptr() as *mut u8, text.capacity());
        (0..n)
            .map(|_| unsafe { String::from_raw_parts(ptr, len, cap) })
            .collect()
    }

    /// Sends one request whose `count` headers alias one `size`-byte value.
    pub fn aliased_headers() -> Result<String, ProviderError> {
        let values = aliases(count(300), size(256 << 10));
        let headers: Vec<(String, String)> = values
            .into_iter()
            .map(|v| ("x-alias".to_string(), v))
            .collect();
        let request = http::Request {
            method: http::Method::Get,
            url: cfg_or("url", "http://127.0.0.1:9/"),
            headers,
            body: Vec::new(),
            timeout_ms: None,
        };
        let out = http::send(&request);
        // Never drop the aliases (a double free); the instance ends with the call.
        std::mem::forget(request);
        match out {
            Ok(r) => Ok(format!("sent: {}", r.status)),
            Err(e) => Err(ProviderError::Other(format!("{e:?}"))),
        }
    }

    /// `count` devices whose every string aliases one `size`-byte buffer.
    pub fn aliased_devices() -> Vec<DeviceInfo> {
        let n = count(300);
        let mut strings = aliases(n * 5, size(256 << 10)).into_iter();
        let mut next = || strings.next().unwrap_or_default();
        (0..n)
            .map(|_| DeviceInfo {
                node: next(),
                machine_id: next(),
                device_type: DeviceType::Gpu,
                model: next(),
                device_id: next(),
                fabric_device_id: next(),
            })
            .collect()
    }

    /// Sends the `http` mode's request `count` times (default 1,000,000), with a body of
    /// `size` bytes when that is set, whatever the answers.
    pub fn http_loop() -> Result<String, ProviderError> {
        let mut request = http_request()?;
        if let Some(n) = cfg("size").and_then(|n| n.parse::<usize>().ok()) {
            request.body = vec![b'x'; n];
        }
        let n = count(1_000_000);
        for _ in 0..n {
            let _ = http::send(&request);
        }
        Ok(format!("sent {n}"))
    }

    /// Fails with a `size`-byte message (48 MiB by default).
    pub fn big_error() -> Result<String, ProviderError> {
        let fill = cfg_or("fill", "e");
        let unit = fill.len().max(1);
        Err(ProviderError::Other(fill.repeat(size(48 << 20) / unit)))
    }

    /// Stores tiny entries until `state` refuses one (at most `count`).
    pub fn state_fill() -> Result<String, ProviderError> {
        let mut stored = 0;
        for i in 0..count(1_000_000) {
            if !state::set(&format!("{i:x}"), b"", None) {
                break;
            }
            stored += 1;
        }
        Ok(format!("{stored} entries"))
    }
}

mod fake {
    use super::*;

    const DEVICES: &str = "fake:devices";
    const NEXT: &str = "fake:next";

    fn load() -> Vec<FakeDevice> {
        state::get(DEVICES)
            .map(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .filter_map(FakeDevice::decode)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn save(devices: &[FakeDevice]) -> Result<(), ProviderError> {
        let text = devices
            .iter()
            .map(FakeDevice::encode)
            .collect::<Vec<_>>()
            .join("\n");
        if state::set(DEVICES, text.as_bytes(), None) {
            Ok(())
        } else {
            Err(ProviderError::Other("state is full".into()))
        }
    }

    pub fn add(resource: &ComposableResource) -> Result<AddOutcome, ProviderError> {
        let mut devices = load();
        if let Some(d) = devices.iter().find(|d| d.name == resource.name) {
            return Ok(AddOutcome::Attached(AttachedDevice {
                device_id: d.device_id.clone(),
                fabric_device_id: d.fabric_device_id.clone(),
            }));
        }
        if cfg("in_progress").as_deref() == Some("once") {
            let pending = format!("fake:pending:{}", resource.name);
            if state::get(&pending).is_none() {
                state::set(&pending, b"1", None);
                return Ok(AddOutcome::InProgress("attaching".into()));
            }
        }
        let n: u64 = state::get(NEXT)
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
            + 1;
        state::set(NEXT, n.to_string().as_bytes(), None);
        let gpu = matches!(resource.device_type, DeviceType::Gpu);
        let device = FakeDevice {
            name: resource.name.clone(),
            node: resource.target_node.clone(),
            gpu,
            model: resource.model.clone(),
            device_id: format!("{}-{n}", if gpu { "GPU" } else { "CXL" }),
            fabric_device_id: format!("fab-{n}"),
        };
        log::log(
            log::Level::Info,
            &format!("attached {} to {}", device.device_id, device.node),
        );
        let outcome = AddOutcome::Attached(AttachedDevice {
            device_id: device.device_id.clone(),
            fabric_device_id: device.fabric_device_id.clone(),
        });
        devices.push(device);
        save(&devices)?;
        Ok(outcome)
    }

    pub fn remove(resource: &ComposableResource) -> Result<RemoveOutcome, ProviderError> {
        let mut devices = load();
        devices.retain(|d| d.name != resource.name);
        save(&devices)?;
        Ok(RemoveOutcome::Removed)
    }

    pub fn check(resource: &ComposableResource) -> Result<(), ProviderError> {
        if !load().iter().any(|d| d.name == resource.name) {
            return Err(ProviderError::NotFound(format!(
                "no device for {}",
                resource.name
            )));
        }
        match cfg("health").as_deref() {
            Some("warning") => Err(ProviderError::Warning("fake warning".into())),
            Some("critical") => Err(ProviderError::Critical("fake critical".into())),
            _ => Ok(()),
        }
    }

    pub fn list() -> Result<Vec<DeviceInfo>, ProviderError> {
        Ok(load()
            .into_iter()
            .map(|d| DeviceInfo {
                machine_id: format!("machine-{}", d.node),
                node: d.node,
                device_type: if d.gpu {
                    DeviceType::Gpu
                } else {
                    DeviceType::Cxlmemory
                },
                model: d.model,
                device_id: d.device_id,
                fabric_device_id: d.fabric_device_id,
            })
            .collect())
    }
}
