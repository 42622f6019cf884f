//! What the real node changes on the host, and undoing it: the kernel sysctls the kubelet
//! rewrites, the `kubepods` cgroups, the mounts under the node's directory, containerd's
//! shims (which outlive containerd), the sockets the kubelet and the shims leave in fixed
//! host paths, and the pod logs under `/var/log`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::files::Paths;
use super::{DEVICE_PLUGIN_DIR, RealNodeError, io_err};
use crate::process::Supervised;

/// Sysctls the kubelet sets at start (its kernel defaults), restored afterwards.
const SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];
/// Host directories the kubelet and containerd's shims write whatever their own roots:
/// entries that appear there during the run are removed by teardown.
const WATCHED_DIRS: [&str; 5] = [
    DEVICE_PLUGIN_DIR,
    "/run/containerd/s",
    "/run/containerd/runc/k8s.io",
    "/var/log/pods",
    "/var/log/containers",
];
/// Records what the running node must undo, so a start after a killed run can sweep it.
const STATE_FILE: &str = "/run/lock/cro-real-node.state";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The host as it was before the node started.
#[derive(Debug, Clone)]
pub(crate) struct HostState(SavedForCheck);

/// What teardown could not undo; empty when the host is as it was.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers(pub Vec<String>);

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Leftovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "nothing");
        }
        write!(f, "{}", self.0.join("; "))
    }
}

pub(crate) fn check_prerequisites() -> Result<(), RealNodeError> {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Err(RealNodeError::Prerequisite(
            "root (the kubelet and containerd manage cgroups, mounts and namespaces)".into(),
        ));
    }
    if !Path::new(CGROUP_ROOT).join("memory").is_dir()
        && !Path::new(CGROUP_ROOT).join("cgroup.controllers").is_file()
    {
        return Err(RealNodeError::Prerequisite(format!(
            "cgroups mounted at {CGROUP_ROOT} (v1 with a memory hierarchy, or v2)"
        )));
    }
    for (tool, package) in [("ctr", "containerd"), ("runc", "runc")] {
        if which(tool).is_none() {
            return Err(RealNodeError::Prerequisite(format!(
                "`{tool}` on PATH (Debian package {package}; scripts/setup.sh installs it)"
            )));
        }
    }
    if !Path::new("/usr/lib/cni/loopback").is_file() {
        return Err(RealNodeError::Prerequisite(
            "the CNI loopback plugin at /usr/lib/cni/loopback (Debian package containernetworking-plugins; scripts/setup.sh installs it)".into(),
        ));
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn read_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()
        .map(|s| s.trim().to_owned())
}

fn dir_entries(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl HostState {
    /// Reads what the run will change and records it for a sweep after a crash.
    pub(crate) fn save(paths: &Paths) -> Result<Self, RealNodeError> {
        let state = SavedForCheck::now();
        let record = serde_json::json!({
            "root": paths.root,
            "sysctls": state.sysctls,
            "entries": state.entries,
        });
        std::fs::write(STATE_FILE, record.to_string())
            .map_err(io_err(format!("cannot write {STATE_FILE}")))?;
        Ok(Self(state))
    }

    /// Undoes the run's changes; `pids` are the processes it started. Returns what is
    /// still there afterwards.
    pub(crate) fn restore(&self, paths: &Paths, pids: &[u32]) -> Leftovers {
        unmount_under(&paths.root);
        remove_cgroups();
        for (dir, before) in &self.0.entries {
            for entry in dir_entries(dir).difference(before) {
                let path = Path::new(dir).join(entry);
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
        for (name, value) in &self.0.sysctls {
            let _ = std::fs::write(Path::new("/proc/sys").join(name), value);
        }
        let _ = std::fs::remove_file(STATE_FILE);
        self.0.leftovers(paths, pids)
    }
}

impl SavedForCheck {
    /// Everything of the run still on the host.
    fn leftovers(&self, paths: &Paths, pids: &[u32]) -> Leftovers {
        let mut left = Vec::new();
        for pid in pids {
            if crate::pid_alive(*pid) {
                left.push(format!("process {pid} ({})", comm(*pid)));
            }
        }
        for pid in processes_mentioning(&paths.root) {
            left.push(format!("process {pid} ({}) of the node", comm(pid)));
        }
        for m in mounts_under(&paths.root) {
            left.push(format!("mount {}", m.display()));
        }
        for cg in kubepods_cgroups() {
            left.push(format!("cgroup {}", cg.display()));
        }
        for (dir, before) in &self.entries {
            for entry in dir_entries(dir).difference(before) {
                left.push(format!("{dir}/{entry}"));
            }
        }
        for (name, value) in &self.sysctls {
            let now = read_sysctl(name).unwrap_or_default();
            if &now != value {
                left.push(format!("sysctl {name} = {now} (was {value})"));
            }
        }
        Leftovers(left)
    }
}

/// A check a test runs after teardown, independent of the node's own bookkeeping: no
/// process, mount, cgroup, socket or sysctl of a real node is left on this machine.
impl Leftovers {
    pub fn check(root: &Path, pids: &[u32], before: &SavedForCheck) -> Leftovers {
        before.leftovers(&Paths::new(root), pids)
    }
}

/// What [`Leftovers::check`] compares against: the host before a node started.
#[derive(Debug, Clone)]
pub struct SavedForCheck {
    sysctls: BTreeMap<String, String>,
    entries: BTreeMap<String, BTreeSet<String>>,
}

impl SavedForCheck {
    /// Reads the host now (before a node starts).
    pub fn now() -> Self {
        Self {
            sysctls: SYSCTLS
                .iter()
                .filter_map(|s| Some((s.to_string(), read_sysctl(s)?)))
                .collect(),
            entries: WATCHED_DIRS
                .iter()
                .map(|d| (d.to_string(), dir_entries(d)))
                .collect(),
        }
    }
}

/// `ctr --address SOCK -n k8s.io ARGS`.
pub(crate) fn ctr(sock: &Path, args: &[&str]) -> Result<String, RealNodeError> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(sock)
        .args(["-n", "k8s.io"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("cannot run ctr"))?;
    if !out.status.success() {
        return Err(RealNodeError::Build {
            script: format!("ctr {}", args.join(" ")),
            message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Stops every container and shim of the node, then containerd; returns the pids of the
/// shims and container processes it found.
pub(crate) fn stop_containers(paths: &Paths, containerd: Option<Supervised>) -> Vec<u32> {
    let mut seen = kill_kubepods();
    if containerd.is_some() {
        // Deleting the tasks lets the shims exit by themselves and unmount the rootfs.
        if let Ok(list) = ctr(&paths.containerd_sock, &["tasks", "ls", "-q"]) {
            for id in list.lines().filter(|l| !l.trim().is_empty()) {
                let _ = ctr(
                    &paths.containerd_sock,
                    &["tasks", "delete", "-f", id.trim()],
                );
            }
        }
    }
    let shims = processes_mentioning(&paths.containerd_sock);
    kill_and_wait(&shims);
    seen.extend(shims);
    if let Some(mut c) = containerd {
        c.kill();
    }
    seen
}

/// Sweeps what a killed run left (its state file names its directory and sysctls).
pub(crate) fn sweep_stale() {
    let Ok(text) = std::fs::read_to_string(STATE_FILE) else {
        return;
    };
    let record: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    kill_kubepods();
    if let Some(root) = record.get("root").and_then(|r| r.as_str()) {
        let root = PathBuf::from(root);
        kill_and_wait(&processes_mentioning(&root));
        unmount_under(&root);
        let _ = std::fs::remove_dir_all(&root);
    }
    remove_cgroups();
    if let Some(entries) = record.get("entries").and_then(|e| e.as_object()) {
        for (dir, before) in entries {
            let before: BTreeSet<String> = before
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            for entry in dir_entries(dir).difference(&before) {
                let path = Path::new(dir).join(entry);
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }
    if let Some(sysctls) = record.get("sysctls").and_then(|s| s.as_object()) {
        for (name, value) in sysctls {
            if let Some(v) = value.as_str() {
                let _ = std::fs::write(Path::new("/proc/sys").join(name), v);
            }
        }
    }
    let _ = std::fs::remove_file(STATE_FILE);
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Live processes whose command line names `path` (containerd's shims name its socket,
/// the node's processes their config files): found by content, then acted on by PID.
fn processes_mentioning(path: &Path) -> Vec<u32> {
    let needle = path.as_os_str().as_encoded_bytes();
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

fn kill_and_wait(pids: &[u32]) {
    for pid in pids {
        // SAFETY: plain syscall; the pid was read from /proc an instant ago.
        unsafe {
            libc::kill(*pid as libc::pid_t, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| crate::pid_alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every `kubepods` cgroup directory, deepest first.
fn kubepods_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut roots = vec![PathBuf::from(CGROUP_ROOT).join("kubepods")];
    if let Ok(rd) = std::fs::read_dir(CGROUP_ROOT) {
        for e in rd.filter_map(|e| e.ok()) {
            roots.push(e.path().join("kubepods"));
        }
    }
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.filter_map(|e| e.ok()) {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_path_buf());
    }
    for root in roots {
        if root.is_dir() {
            walk(&root, &mut found);
        }
    }
    found
}

/// Kills every process in a `kubepods` cgroup (the pods' containers); returns their pids.
fn kill_kubepods() -> Vec<u32> {
    let mut pids = BTreeSet::new();
    for cg in kubepods_cgroups() {
        if let Ok(text) = std::fs::read_to_string(cg.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    let pids: Vec<u32> = pids.into_iter().collect();
    kill_and_wait(&pids);
    pids
}

fn remove_cgroups() {
    for _ in 0..50 {
        let left = kubepods_cgroups();
        if left.is_empty() {
            return;
        }
        for cg in left {
            let _ = std::fs::remove_dir(&cg);
        }
        if kubepods_cgroups().is_empty() {
            return;
        }
        // A cgroup whose last process was just killed may be busy for a moment.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Mount points at or below `root`, deepest first (from /proc/self/mountinfo).
fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_path(field: &str) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

fn unmount_under(root: &Path) {
    for _ in 0..5 {
        let mounts = mounts_under(root);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: plain syscall with a NUL-terminated path; a lazy unmount so a busy
            // mount is detached now and released when its last user goes.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_mount_path(r"/tmp/a\040b/c"),
            PathBuf::from("/tmp/a b/c")
        );
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
    }
}
