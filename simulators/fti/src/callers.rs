//! Who called the simulator: the record of calls with their callers
//! ([`FabricSim::calls`](crate::FabricSim::calls)), and a resolver that names the
//! process on this machine owning a client's socket ([`PidResolver`]).
//!
//! A test running several operator processes against one simulator installs a
//! [`PidResolver`] with their pids ([`FabricSim::record_callers`](crate::FabricSim::record_callers));
//! each call is then recorded with the name of the process it came from, so the test
//! can check which process made which fabric call. The resolver is asked when the
//! simulator accepts a connection (the client is waiting for its handshake then, so its
//! socket exists), and again at its requests while it has no name.
//!
//! How a connection becomes a process (Linux): the client's socket is the one whose
//! *local* address is the peer address the simulator sees and whose *remote* address is
//! the simulator's side of the connection, listed with its inode in `/proc/net/tcp` or
//! `/proc/net/tcp6` (both ends, since the kernel gives one local port to connections to
//! different servers at once: matched by the local address alone, the sharding test saw
//! a call named after a replica that held no Lease, and others after no process at all); the process
//! owning it has `socket:[inode]` among
//! the links of `/proc/<pid>/fd/`. Only the pids the test gave are looked at. Anything
//! not found (another process, a socket already closed, no /proc) is None: recorded as
//! an unknown caller, for the test to judge.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

pub use sim_kit::CallerResolver;

use crate::record::Route;

/// One request the simulator received, with who sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// The request's number in the simulator's request log
    /// ([`RecordedRequest::seq`](crate::RecordedRequest)).
    pub seq: u64,
    /// When it arrived, on the system's clock (not the simulator's, which a test may
    /// move): comparable with the times other processes write, such as a Lease's.
    pub at: SystemTime,
    pub method: String,
    /// Path without the query.
    pub path: String,
    pub route: Option<Route>,
    /// The client's address (its side of the connection).
    pub peer: SocketAddr,
    /// The resolver's name for the client's connection; None when no resolver was
    /// installed as the connection was accepted, or it did not know the client.
    pub caller: Option<String>,
}

/// Names the processes of a given set of pids by the sockets they own: a
/// [`CallerResolver`] for [`FabricSim::record_callers`](crate::FabricSim::record_callers).
/// Clones share one set, so a test adds a process it starts (and removes one it ended)
/// while the simulator already uses the resolver.
#[derive(Clone, Debug, Default)]
pub struct PidResolver {
    names: Arc<Mutex<BTreeMap<u32, String>>>,
}

impl PidResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Names the process `pid` `name` (replacing a name it had).
    pub fn insert(&self, pid: u32, name: impl Into<String>) {
        self.lock().insert(pid, name.into());
    }

    /// Forgets `pid`; returns its name if it had one. A pid may be reused once its
    /// process is reaped, so a test removes a process it has killed.
    pub fn remove(&self, pid: u32) -> Option<String> {
        self.lock().remove(&pid)
    }

    /// The pids known, with their names.
    pub fn names(&self) -> BTreeMap<u32, String> {
        self.lock().clone()
    }

    /// The name of the known process owning the client socket of the connection from
    /// `peer` to `server`.
    pub fn resolve(&self, peer: SocketAddr, server: SocketAddr) -> Option<String> {
        let names = self.names();
        let owner = owner_of(peer, server, names.keys().copied())?;
        names.get(&owner).cloned()
    }

    /// This resolver as the simulator takes it. A connection it cannot name is said on
    /// stderr with what was found of it (the socket, and which process on the machine
    /// owns it), so a test that sees an unknown caller can tell why.
    pub fn resolver(&self) -> CallerResolver {
        let this = self.clone();
        Arc::new(move |peer, server| {
            let name = this.resolve(peer, server);
            if name.is_none() {
                eprintln!(
                    "fabric-sim: caller of {peer} (to {server}) not named: {}",
                    explain(peer, server)
                );
            }
            name
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, String>> {
        sim_kit::lock(&self.names)
    }
}

/// Which of `pids` owns the TCP socket from `local` to `remote`; None if none does, or
/// the socket is not found.
pub fn owner_of(
    local: SocketAddr,
    remote: SocketAddr,
    pids: impl IntoIterator<Item = u32>,
) -> Option<u32> {
    let inode = socket_inode(local, remote).ok().flatten()?;
    pids.into_iter().find(|&pid| owns_socket(pid, inode))
}

/// The inode of the TCP socket from `local` to `remote`, from `/proc/net/tcp` and
/// `/proc/net/tcp6` (this process's network namespace). Both ends are matched: the
/// kernel gives one local port to a process's connections to different servers at once,
/// so the local address alone may find another connection's socket (another process's,
/// or one of the same process to another server). None if no open socket is that
/// connection; an error if neither table can be read.
pub fn socket_inode(local: SocketAddr, remote: SocketAddr) -> io::Result<Option<u64>> {
    let mut read_any = None;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match std::fs::read_to_string(table) {
            Ok(text) => {
                if let Some(inode) = find_inode(&text, local, remote) {
                    return Ok(Some(inode));
                }
                read_any = Some(Ok(None));
            }
            Err(e) => {
                read_any.get_or_insert(Err(e));
            }
        }
    }
    read_any.unwrap_or(Ok(None))
}

/// What can be found of the client socket from `local` to `remote`: its inode, and the
/// process (of all on the machine) that owns it, by pid and command line.
pub fn explain(local: SocketAddr, remote: SocketAddr) -> String {
    let inode = match socket_inode(local, remote) {
        Ok(Some(inode)) => inode,
        Ok(None) => return "no open socket is that connection".into(),
        Err(e) => return format!("cannot read /proc/net/tcp: {e}"),
    };
    let pids = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    let owners: Vec<String> = pids
        .filter(|&pid| owns_socket(pid, inode))
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            format!("pid {pid} ({})", cmdline.trim())
        })
        .collect();
    if owners.is_empty() {
        format!("socket inode {inode}, owned by no process")
    } else {
        format!("socket inode {inode}, owned by {}", owners.join(", "))
    }
}

/// Whether `/proc/<pid>/fd/` has a link to `socket:[inode]`. False for a process that
/// is gone or whose descriptors this process may not read.
pub fn owns_socket(pid: u32, inode: u64) -> bool {
    let target = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("fd")) else {
        return false;
    };
    // A descriptor closed between the listing and the read is skipped.
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == target.as_str())
    })
}

/// The inode on the line of a `/proc/net/tcp{,6}` table whose local address is `local`
/// and remote address `remote` (an IPv4 address also matches its IPv4-mapped IPv6 form:
/// a dual-stack socket). Lines without an inode (0: a socket in TIME_WAIT, owned by no
/// process) are skipped.
fn find_inode(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let want = (canonical(local), canonical(remote));
    table.lines().skip(1).find_map(|line| {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid
        // timeout inode ...
        let fields: Vec<&str> = line.split_whitespace().collect();
        let from = parse_address(fields.get(1)?)?;
        let to = parse_address(fields.get(2)?)?;
        let inode: u64 = fields.get(9)?.parse().ok()?;
        (inode != 0 && (canonical(from), canonical(to)) == want).then_some(inode)
    })
}

/// IPv4-mapped IPv6 addresses as IPv4, so both forms of one address compare equal.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

/// An address as the kernel writes it in `/proc/net/tcp{,6}`: `HEX_IP:HEX_PORT`, the
/// IP as 32-bit words each printed as a number in this machine's byte order (so the
/// word's bytes in memory order are the address's bytes), the port as a number.
fn parse_address(field: &str) -> Option<SocketAddr> {
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// The kernel's text for `addr` on this machine (the inverse of `parse_address`).
    fn kernel_text(addr: SocketAddr) -> String {
        let word = |b: &[u8]| format!("{:08X}", u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        let ip = match addr.ip() {
            IpAddr::V4(v4) => word(&v4.octets()),
            IpAddr::V6(v6) => v6.octets().chunks(4).map(word).collect(),
        };
        format!("{ip}:{:04X}", addr.port())
    }

    #[test]
    fn addresses_as_the_kernel_writes_them() {
        for addr in [
            "127.0.0.1:8080",
            "10.1.2.3:1",
            "[::1]:443",
            "[fe80::1:2:3]:65535",
            "[::ffff:127.0.0.1]:40000",
        ] {
            let addr: SocketAddr = addr.parse().unwrap();
            assert_eq!(parse_address(&kernel_text(addr)), Some(addr), "{addr}");
        }
        assert_eq!(parse_address("0100007F"), None);
        assert_eq!(parse_address("0100007F:XYZ"), None);
        assert_eq!(parse_address("007F:0050"), None);
    }

    #[test]
    fn a_table_line_gives_its_inode() {
        let client: SocketAddr = "127.0.0.1:40123".parse().unwrap();
        let server: SocketAddr = "127.0.0.1:8443".parse().unwrap();
        let line = |local, remote, inode| {
            format!(
                "   0: {}  {} 01 00000000:00000000 00:00000000 00000000  1000        0 {inode} 1 0000000000000000 20 4 30 10 -1",
                kernel_text(local),
                kernel_text(remote)
            )
        };
        let header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";
        let elsewhere: SocketAddr = "127.0.0.1:6443".parse().unwrap();
        let table = [
            header.to_owned(),
            line(server, client, 111),
            line(client, server, 0),
            // The same local port, another process's connection to another server.
            line(client, elsewhere, 444),
            line(client, server, 222),
        ]
        .join("\n");
        // The server's side has the client's address as its remote one: not it; the
        // TIME_WAIT line has no owner; the connection to another server is another.
        assert_eq!(find_inode(&table, client, server), Some(222));
        assert_eq!(find_inode(&table, client, elsewhere), Some(444));
        assert_eq!(
            find_inode(&table, client, "127.0.0.1:1".parse().unwrap()),
            None
        );
        assert_eq!(
            find_inode(&table, "127.0.0.1:1".parse().unwrap(), server),
            None
        );
        // A dual-stack client socket is listed in tcp6 under the mapped addresses.
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:40123".parse().unwrap();
        let mapped_server: SocketAddr = "[::ffff:127.0.0.1]:8443".parse().unwrap();
        let table6 = [header.to_owned(), line(mapped, mapped_server, 333)].join("\n");
        assert_eq!(find_inode(&table6, client, server), Some(333));
        assert_eq!(find_inode("", client, server), None);
        assert_eq!(
            find_inode(&format!("{header}\n garbage"), client, server),
            None
        );
    }

    /// The real thing: a connection within this process is found as this process's.
    #[test]
    fn a_socket_of_this_process_is_found_by_its_address() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = TcpStream::connect(server).unwrap();
        let (accepted, peer) = listener.accept().unwrap();
        // What the server sees as the peer is the client's local address.
        assert_eq!(peer, client.local_addr().unwrap());

        let me = std::process::id();
        let inode = socket_inode(peer, server)
            .unwrap()
            .expect("the client socket is listed");
        assert!(owns_socket(me, inode));
        assert_eq!(owner_of(peer, server, [u32::MAX, me]), Some(me));

        let resolver = PidResolver::new();
        assert_eq!(resolver.resolve(peer, server), None, "no pid given yet");
        resolver.insert(me, "the test");
        let shared = resolver.clone();
        assert_eq!(
            (shared.resolver())(peer, server).as_deref(),
            Some("the test")
        );
        assert_eq!(resolver.remove(me).as_deref(), Some("the test"));
        assert_eq!(shared.resolve(peer, server), None, "clones share the set");

        // Once closed, the socket is not found (its TIME_WAIT line has no inode).
        resolver.insert(me, "the test");
        drop(client);
        drop(accepted);
        assert_eq!(resolver.resolve(peer, server), None);
    }
}
