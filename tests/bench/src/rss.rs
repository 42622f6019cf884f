//! Resident memory, from /proc/<pid>/status and /proc/self/smaps.

/// (VmRSS, VmHWM) in bytes of this process: resident now, and the peak so far.
pub fn rss() -> (u64, u64) {
    rss_from("/proc/self/status")
}

/// (VmRSS, VmHWM) in bytes of process `pid` (a child this process started); (0, 0) once
/// it is gone.
pub fn rss_of(pid: u32) -> (u64, u64) {
    rss_from(&format!("/proc/{pid}/status"))
}

fn rss_from(status_file: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(status_file).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// This process's resident memory by what holds it, from /proc/self/smaps, in bytes:
/// `binary` (the executable's code and data), `files` (other file mappings: libraries,
/// compiled components), `heap` (the main malloc heap), `pool` (anonymous reservations
/// of 1 GiB or more: wasmtime's pooling allocator), `anon` (every other anonymous
/// mapping: malloc's thread arenas, thread stacks, compiled code, kube and tokio data).
pub fn breakdown() -> serde_json::Value {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut sums = std::collections::BTreeMap::<&str, u64>::new();
    let mut class = "anon";
    let mut size_kb = 0u64;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, perms, offset, dev, inode, path.
            let (lo, hi) = first.split_once('-').unwrap_or(("0", "0"));
            let span = u64::from_str_radix(hi, 16)
                .unwrap_or(0)
                .saturating_sub(u64::from_str_radix(lo, 16).unwrap_or(0));
            size_kb = span / 1024;
            let path = words.nth(4).unwrap_or("");
            class = if !exe.is_empty() && path == exe {
                "binary"
            } else if path.starts_with('/') {
                "files"
            } else if path == "[heap]" {
                "heap"
            } else if path.is_empty() && size_kb >= 1 << 20 {
                "pool"
            } else {
                "anon"
            };
        } else if first == "Rss:" {
            let kb: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            *sums.entry(class).or_default() += kb * 1024;
        }
    }
    let _ = size_kb;
    serde_json::json!(sums)
}
