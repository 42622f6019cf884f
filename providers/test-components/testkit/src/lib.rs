//! `cro-testkit`: one provider component whose behaviour is chosen per call, for the
//! runtime's tests.
//!
//! The behaviour is the provider config key `mode`, overridden for one call by a resource
//! whose `model` is `mode:<name>` (so one provider can run a well-behaved call next to a
//! misbehaving one); `mode:<name>;<key>=<value>;...` also overrides config keys for that
//! call (the `config` interface itself is not affected). Modes:
//!
//! | mode          | what the call does |
//! |---------------|--------------------|
//! | `fake` (default) | a well-behaved fake fabric keeping its devices in the `state` interface |
//! | `loop`        | spins the CPU forever |
//! | `sleep`       | sleeps config `secs` (default 3600) in a WASI poll, i.e. waits inside the host |
//! | `membomb`     | allocates (and touches) 1 MiB blocks until the allocator is refused |
//! | `trap`        | panics with config `message` (default `testkit trap`) after writing config `noise_bytes` bytes to stderr |
//! | `exit`        | calls `std::process::exit(3)` |
//! | `http`, `sleep-http` | sends config `method` (default GET) to config `url`, with config `body` and `timeout_ms` |
//! | `secret`      | reads the secret key named by config `key` |
//! | `lookup`      | config `what`: `node` (config `name`), `nodes`, or `object` (`api_version`, `kind`, `namespace`, `name`) |
//! | `config`      | returns config `key`'s value and the number of entries |
//! | `log`         | logs config `message` at every level |
//! | `state`       | stores config `bytes` bytes under config `key` with config `ttl_ms`, or with `op=get` reads it |
//! | `wasi-fs`     | tries to read `/etc/passwd`, list `/` and `.`, and create a file |
//! | `wasi-env`    | counts environment variables and arguments |
//! | `wasi-clock`  | reports the wall clock (seconds since the Unix epoch) |
//! | `wasi-socket` | tries TCP to config `addr`, a UDP bind, and a name lookup |
//! | `log-loop`    | logs config `message` (or `size` bytes, default 64) `count` times (default 1,000,000) |
//! | `deny-big`    | `count` times (default 20) asks for an ungranted URL, Secret key, kind and Node named with `size`-byte (default 1 MiB) strings; fails `denied` with the last denials |
//! | `read-loop`   | reads config `what` (`secret` key `key`, `node` named `name`, `nodes`) `count` times (default 20,000) |
//! | `alias-send`  | sends one request to config `url` with `count` (300) headers whose values all alias one `size`-byte (256 KiB) buffer |
//! | `alias-return`| (`get-resources` only) returns `count` (300) devices whose strings all alias one `size`-byte (256 KiB) buffer |
//! | `http-loop`   | sends the `http` mode's request `count` times (default 1,000,000), with a `size`-byte body when set |
//! | `pollables`   | holds `count` WASI pollables at once (default 100,000): host-side resource handles |
//! | `big-error`   | fails with a `size`-byte (48 MiB) message of config `fill` (default `e`) repeated |
//! | `state-fill`  | stores tiny entries in `state` until one is refused (at most `count`) |
//!
//! The `http` mode also sends config `headers` (`name: value|name: value`).
//!
//! Non-`fake` modes answer `add-resource` with `attached{device-id: <result>,
//! fabric-device-id: <mode>}` and map failures to the `provider-error` variants; the other
//! operations run the same mode and discard the result.

pub mod modes;

#[cfg(target_arch = "wasm32")]
mod guest;
