//! Misbehaving calls each fail with their own typed error within the deadline, only that
//! call is affected, and the host keeps serving well-behaved calls during and after.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use cro_runtime::AddRequest;
use cro_runtime::{AddOutcome, CallError, Provider, ProviderSpec};

const DEADLINE: Duration = Duration::from_millis(1500);

fn tight(mut spec: ProviderSpec) -> ProviderSpec {
    spec.limits.call_timeout_ms = DEADLINE.as_millis() as u64;
    spec.limits.memory_bytes = 32 << 20;
    spec
}

/// Runs fake-fabric calls on `provider` until `stop`, counting successes; any failure
/// fails the test.
fn keep_serving(provider: Provider, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let served = AtomicUsize::new(0);
        let mut i = 0;
        while !stop.load(Ordering::SeqCst) {
            i += 1;
            let r = gpu(&format!("good-{i}"));
            let out = provider.add(&AddRequest::new(r.clone())).await;
            assert!(matches!(out, Ok(AddOutcome::Attached(_))), "{out:?}");
            provider.check_resource(&r).await.unwrap();
            served.fetch_add(1, Ordering::SeqCst);
        }
        served.into_inner()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_misbehaviour_gets_its_own_error_while_others_are_served() {
    let provider = load(&tight(spec("fake", &[("message", "testkit boom")]))).await;
    let other = load(&tight(spec("fake", &[]))).await;
    let stop = Arc::new(AtomicBool::new(false));
    let same = keep_serving(provider.clone(), stop.clone());
    let elsewhere = keep_serving(other.clone(), stop.clone());

    let (spin, trap, bomb) = (
        AddRequest::new(in_mode("spin", "loop")),
        AddRequest::new(in_mode("trap", "trap")),
        AddRequest::new(in_mode("bomb", "membomb")),
    );
    let (spin, trap, bomb) = tokio::join!(
        timed(provider.add(&spin)),
        timed(provider.add(&trap)),
        timed(provider.add(&bomb)),
    );
    stop.store(true, Ordering::SeqCst);

    let (spin, took) = spin;
    assert_eq!(spin, Err(CallError::Timeout(DEADLINE)));
    assert!(
        took >= DEADLINE && took < DEADLINE + SLACK,
        "loop took {took:?}"
    );

    let (trap, took) = trap;
    let Err(CallError::Trap { message, stderr }) = &trap else {
        panic!("{trap:?}")
    };
    assert!(message.contains("unreachable"), "{message}");
    assert!(stderr.contains("testkit boom"), "{stderr}");
    assert!(took < DEADLINE + SLACK, "trap took {took:?}");

    let (bomb, took) = bomb;
    assert_eq!(
        bomb,
        Err(CallError::OutOfMemory {
            limit_bytes: 32 << 20
        })
    );
    assert!(took < DEADLINE + SLACK, "membomb took {took:?}");

    let served_same = same.await.unwrap();
    let served_elsewhere = elsewhere.await.unwrap();
    assert!(
        served_same > 0 && served_elsewhere > 0,
        "{served_same} {served_elsewhere}"
    );

    // And afterwards both providers still work, with the state the good calls left.
    assert!(provider.list(&[]).await.unwrap().len() >= served_same);
    assert!(other.list(&[]).await.unwrap().len() >= served_elsewhere);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_or_timeout_does_not_touch_a_concurrent_call_to_the_same_provider() {
    let provider = load(&tight(spec("fake", &[]))).await;
    // The good call starts while the bad ones run and must see none of their effects.
    let (spin, trap) = (in_mode("spin", "loop"), in_mode("trap", "trap"));
    let (spin, trap, good) = tokio::join!(
        provider.check_resource(&spin),
        provider.check_resource(&trap),
        async {
            let first = provider.add(&AddRequest::new(gpu("g"))).await;
            let second = provider.add(&AddRequest::new(gpu("g"))).await;
            (first, second)
        },
    );
    assert_eq!(spin, Err(CallError::Timeout(DEADLINE)));
    assert!(matches!(trap, Err(CallError::Trap { .. })), "{trap:?}");
    let (first, second) = good;
    assert!(matches!(first, Ok(AddOutcome::Attached(_))), "{first:?}");
    assert_eq!(first, second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaviour_in_every_operation_is_contained() {
    let provider = load(&tight(spec("trap", &[]))).await;
    assert!(matches!(
        provider.list(&[]).await,
        Err(CallError::Trap { .. })
    ));
    assert!(matches!(
        provider.remove_resource(&gpu("a")).await,
        Err(CallError::Trap { .. })
    ));
    let exiting = load(&tight(spec("exit", &[]))).await;
    // WASI 0.2 `exit` only tells success from failure: exit(3) arrives as status 1.
    let exited = exiting.check_resource(&gpu("a")).await;
    assert!(
        matches!(&exited, Err(CallError::Trap { message, .. }) if message == "the provider called exit(1)"),
        "{exited:?}"
    );
    let spinning = load(&tight(spec("loop", &[]))).await;
    assert_eq!(spinning.list(&[]).await, Err(CallError::Timeout(DEADLINE)));
    // The resource's model overrides the configured mode per call.
    assert!(matches!(
        provider.add(&AddRequest::new(in_mode("ok", "fake"))).await,
        Ok(AddOutcome::Attached(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_stderr_is_bounded_and_keeps_the_panic_message() {
    let provider = load(&tight(spec(
        "trap",
        &[("noise_bytes", "2000000"), ("message", "the end")],
    )))
    .await;
    let err = provider.add(&AddRequest::new(gpu("a"))).await.unwrap_err();
    let CallError::Trap { stderr, .. } = &err else {
        panic!("{err:?}")
    };
    let cap = runtime().options().guest_output_bytes;
    assert!(stderr.len() < cap + 100, "{} bytes kept", stderr.len());
    assert!(stderr.contains("earlier bytes dropped"), "{stderr:.200}");
    assert!(stderr.contains("the end"), "{stderr:.200}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_calls_than_slots_wait_instead_of_failing() {
    let mut spec = tight(spec("fake", &[]));
    spec.limits.max_concurrent_calls = 2;
    let provider = load(&spec).await;
    let calls = (0..12).map(|i| {
        let provider = provider.clone();
        tokio::spawn(async move { provider.add(&AddRequest::new(gpu(&format!("r{i}")))).await })
    });
    for call in calls {
        assert!(matches!(call.await.unwrap(), Ok(AddOutcome::Attached(_))));
    }
    // Two loops fill the provider's slots; a third call waits for one, then runs.
    let (s1, s2) = (in_mode("s1", "loop"), in_mode("s2", "loop"));
    let (a, b, c) = tokio::join!(
        provider.check_resource(&s1),
        provider.check_resource(&s2),
        timed(provider.list(&[])),
    );
    assert_eq!(a, Err(CallError::Timeout(DEADLINE)));
    assert_eq!(b, Err(CallError::Timeout(DEADLINE)));
    let (listed, took) = c;
    assert_eq!(listed.unwrap().len(), 12);
    // Unblocked only when a loop hit its deadline (a free call takes milliseconds).
    assert!(
        took >= DEADLINE / 2,
        "the third call did not wait: {took:?}"
    );
}

// One thread: the spinning guest must yield for the other call to make progress at all.
#[tokio::test(flavor = "current_thread")]
async fn a_spinning_guest_does_not_starve_a_single_threaded_runtime() {
    let provider = load(&tight(spec("fake", &[]))).await;
    let spin = in_mode("spin", "loop");
    let (spun, good) = tokio::join!(provider.check_resource(&spin), async {
        let mut served = 0;
        for i in 0..5 {
            let r = gpu(&format!("g{i}"));
            assert!(matches!(
                provider.add(&AddRequest::new(r.clone())).await,
                Ok(AddOutcome::Attached(_))
            ));
            served += 1;
        }
        served
    });
    assert_eq!(spun, Err(CallError::Timeout(DEADLINE)));
    assert_eq!(good, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_waiting_inside_the_host_is_stopped_at_its_deadline() {
    let provider = load(&tight(spec("sleep", &[]))).await;
    let (out, took) = timed(provider.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(out, Err(CallError::Timeout(DEADLINE)));
    assert!(took >= DEADLINE && took < DEADLINE + SLACK, "{took:?}");
    // A short nap within the deadline is fine.
    let napping = load(&tight(spec("sleep", &[("secs", "0")]))).await;
    assert!(napping.add(&AddRequest::new(gpu("a"))).await.is_ok());
}

// ---- Budgets on what a call hands the host.

use std::sync::Arc as StdArc;

use cro_runtime::cluster::StaticCluster;
use cro_runtime::{Budget, BudgetExceeded, DeviceInfo, LoadError, ProviderError};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_aliases_of_one_string_passed_to_the_host_are_refused() {
    // 300 headers aliasing one 256 KiB value: 75 MiB for the host from 256 KiB of guest
    // data, were it copied.
    let p = load(&tight(spec("alias-send", &[]))).await;
    let limit = p.spec().limits.effective_host_call_bytes();
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(BudgetExceeded {
            budget: Budget::HostCallBytes,
            limit
        }))
    );
    assert_eq!(p.budgets().get(Budget::HostCallBytes), 1);
    // Few aliases are fine (the request itself is then refused: nothing granted).
    let few = load(&tight(spec("alias-send", &[("count", "4")]))).await;
    let out = few.add(&AddRequest::new(gpu("a"))).await;
    assert!(
        matches!(&out, Err(CallError::Provider(ProviderError::Other(m))) if m.contains("Denied")),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_aliases_of_one_string_returned_to_the_host_are_refused() {
    let p = load(&tight(spec("alias-return", &[]))).await;
    let limit = p.spec().limits.effective_host_call_bytes();
    let (out, _) = beside_a_good_provider(p.list(&[])).await;
    assert_eq!(
        out,
        Err(CallError::Budget(BudgetExceeded {
            budget: Budget::HostCallBytes,
            limit
        }))
    );
    // Within the budget the strings arrive, each cut to the provider-text limit.
    let small = load(&tight(spec(
        "alias-return",
        &[("count", "2"), ("size", "100000")],
    )))
    .await;
    let devices: Vec<DeviceInfo> = small.list(&[]).await.unwrap();
    assert_eq!(devices.len(), 2);
    let max = small.spec().limits.provider_text_bytes as usize;
    assert!(
        devices.iter().all(|d| d.model.len() < max + 40),
        "{}",
        devices[0].model.len()
    );
    assert!(small.budgets().get(Budget::ProviderText) >= 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_48_mib_error_message_never_reaches_the_operator_whole() {
    let mut big = spec("big-error", &[]);
    big.limits.memory_bytes = 128 << 20;
    let p = load(&big).await;
    let limit = p.spec().limits.effective_host_call_bytes();
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(BudgetExceeded {
            budget: Budget::HostCallBytes,
            limit
        }))
    );
    // Allowed to hand over that much, it is still cut at the runtime boundary.
    big.limits.host_call_bytes = 64 << 20;
    let p = load(&big).await;
    let out = p.add(&AddRequest::new(gpu("a"))).await;
    let Err(CallError::Provider(ProviderError::Other(m))) = &out else {
        panic!("{out:?}")
    };
    let max = p.spec().limits.provider_text_bytes as usize;
    assert!(m.len() < max + 40, "{} bytes", m.len());
    assert!(m.ends_with("more bytes cut]"), "{}", &m[m.len() - 40..]);
    assert_eq!(p.budgets().get(Budget::ProviderText), 1);
}

/// An 8 MiB error of control characters is clipped before it is escaped: the message
/// that reaches the operator is bounded and escaped, and the host spends no more on it
/// than on a plain one (escaping it whole cost seconds after a 1 s deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_of_control_characters_is_clipped_before_it_is_escaped() {
    let mut hostile = spec("big-error", &[("size", "8388608"), ("fill", "\u{1}")]);
    hostile.limits.memory_bytes = 128 << 20;
    hostile.limits.host_call_bytes = 64 << 20;
    hostile.limits.call_timeout_ms = 1_000;
    let p = load(&hostile).await;
    let mut plain_spec = hostile.clone();
    plain_spec.config.insert("fill".into(), "e".into());
    let plain = load(&plain_spec).await;
    let (_, plain_took) = timed(plain.add(&AddRequest::new(gpu("a")))).await;
    let (out, took) = timed(p.add(&AddRequest::new(gpu("a")))).await;
    let Err(CallError::Provider(ProviderError::Other(m))) = &out else {
        panic!("{out:?}")
    };
    let max = p.spec().limits.provider_text_bytes as usize;
    assert!(m.len() < max + 40, "{} bytes", m.len());
    assert!(m.starts_with("\\u{1}\\u{1}"), "{}", &m[..40]);
    assert!(!m.chars().any(char::is_control));
    assert!(m.ends_with("more bytes cut]"), "{}", &m[m.len() - 40..]);
    assert_eq!(p.budgets().get(Budget::ProviderText), 1);
    eprintln!("8 MiB of control characters: {took:?}; of plain text: {plain_took:?}");
    assert!(
        took < plain_took * 3 + Duration::from_millis(200),
        "{took:?} against {plain_took:?} for plain text"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn components_larger_than_a_pool_slot_are_refused_at_load() {
    let options = runtime().options().clone();
    let refusals = async {
        let greedy = ProviderSpec::new("greedy", "unused.wasm");
        for (instances, memories) in [
            (options.max_core_instances_per_component as usize + 1, 0),
            (1, options.max_memories_per_component as usize + 1),
            (1, 64),
        ] {
            let bytes = greedy_component(instances, memories);
            let err = runtime()
                .load_bytes(&greedy, bytes, StdArc::new(StaticCluster::new()))
                .await
                .unwrap_err();
            assert!(matches!(err, LoadError::TooLarge(_)), "{err:?}");
            assert!(err.to_string().contains("exceeds"), "{err}");
        }
        // One at the limit loads, and many calls of it at once leave the others' slots.
        let mut hog = spec("fake", &[]);
        hog.name = "hog".into();
        hog.limits.memory_bytes = 16 << 20;
        hog.limits.max_concurrent_calls = 32;
        let bytes = memory_hog(options.max_memories_per_component as usize, 0);
        let hog = runtime()
            .load_bytes(&hog, bytes, StdArc::new(StaticCluster::new()))
            .await
            .unwrap();
        let calls = (0..32).map(|i| {
            let hog = hog.clone();
            tokio::spawn(async move { hog.check_resource(&gpu(&format!("h{i}"))).await })
        });
        for call in calls {
            assert_eq!(
                call.await.unwrap(),
                Err(CallError::OutOfMemory {
                    limit_bytes: 16 << 20
                })
            );
        }
    };
    beside_a_good_provider(refusals).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_text_cannot_forge_a_line_in_the_operators_logs() {
    // An error message and a panic with line breaks in them: both end up in the
    // operator's own log lines and in `status.error`, so they arrive escaped.
    let p = load(&tight(spec("no such mode\nERROR forged line", &[]))).await;
    let out = p.add(&AddRequest::new(gpu("a"))).await;
    let Err(CallError::Provider(cro_runtime::ProviderError::Config(m))) = &out else {
        panic!("{out:?}")
    };
    assert!(
        !m.contains('\n') && m.contains("no such mode\\nERROR forged line"),
        "{m}"
    );

    let p = load(&tight(spec(
        "trap",
        &[("message", "boom\nERROR forged\u{2028}line")],
    )))
    .await;
    let err = p.add(&AddRequest::new(gpu("a"))).await.unwrap_err();
    assert!(matches!(err, CallError::Trap { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        !shown.contains(['\n', '\r', '\u{2028}']),
        "a raw line break reached the host: {shown:?}"
    );
    assert!(
        shown.contains("boom\\nERROR forged\\u{2028}line"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_could_forge_or_disguise_a_log_line_are_refused() {
    // The testkit's `config` mode answers `attached` with the configured value as the
    // device id (followed by `|<number of config entries>`).
    let attach = |id: &str| {
        let spec = tight(spec("config", &[("key", "id"), ("id", id)]));
        async move { load(&spec).await.add(&AddRequest::new(gpu("a"))).await }
    };
    for (id, shown) in [
        (
            "gpu-1\n2026-12-01T00:00:00Z INFO forged line \u{1b}[2J",
            r"gpu-1\n2026-12-01T00:00:00Z INFO forged line \u{1b}[2J",
        ),
        ("gpu-1\u{202E}live", r"gpu-1\u{202e}live"),
        ("gpu\u{200B}-1", r"gpu\u{200b}-1"),
    ] {
        let out = attach(id).await;
        let Err(CallError::Provider(ProviderError::MalformedReply(m))) = &out else {
            panic!("{id:?}: {out:?}")
        };
        assert!(m.contains("device-id") && m.contains(shown), "{m}");
        assert!(
            !m.contains(['\n', '\u{1b}', '\u{202E}', '\u{200B}']),
            "a raw character reached the host's text: {m:?}"
        );
    }
    // An ordinary id comes through unchanged.
    let out = attach("GPU-8d2c7a1e").await.unwrap();
    let AddOutcome::Attached(device) = out else {
        panic!("{out:?}")
    };
    assert_eq!(device.device_id, "GPU-8d2c7a1e|3");
}

/// WASI resources a call holds (streams, pollables) live on the host's heap, outside the
/// call's memory budget: 100,000 pollables cost the host 29 MiB before they were
/// counted. The table refuses the handle over `limits.wasi_handles_per_call` and the call
/// fails with that budget, while a good provider is served beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasi_handles_held_by_a_call_are_bounded() {
    let hostile = spec("pollables", &[("count", "100000")]);
    let p = load(&hostile).await;
    let limit = p.spec().limits.wasi_handles_per_call;
    let (out, _) = beside_a_good_provider(p.add(&AddRequest::new(gpu("a")))).await;
    assert_eq!(
        out,
        Err(CallError::Budget(BudgetExceeded {
            budget: Budget::WasiHandles,
            limit: u64::from(limit),
        }))
    );
    assert_eq!(p.budgets().get(Budget::WasiHandles), 1);
    // Below the budget the same call succeeds: it is the count that is refused.
    let mut fits = hostile.clone();
    let half = (limit / 2).to_string();
    fits.config.insert("count".into(), half);
    let p = load(&fits).await;
    let out = p.add(&AddRequest::new(gpu("b"))).await;
    assert!(out.is_ok(), "{out:?}");
}
