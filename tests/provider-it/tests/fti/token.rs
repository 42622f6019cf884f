//! The access token: fetched once, reused, renewed 30 s before `exp`; credentials.

use std::time::Duration;

use cro_runtime::{AddRequest, ProviderError, RemoveOutcome};
use fabric_sim::{Fault, Route};
use provider_it::{Api, Fixture, MODEL, SECRET_NAME, SECRET_NAMESPACE, TestClock};

use crate::*;

#[tokio::test]
async fn one_token_serves_a_sequence_of_calls() {
    for api in [Api::Fm, Api::Cm] {
        let fx = Fixture::builder(api)
            .with_sim_config(|c| c.with_cm_delay(Duration::from_secs(3600)))
            .start()
            .await;
        fx.sim.add_free_devices("gpu", MODEL, 2);
        let node = "worker-0";
        match api {
            Api::Fm => fx.add_provider_id_node(node),
            Api::Cm => fx.add_openshift_node(node),
        };
        let mut gpu = fx.gpu("gpu-a", node);
        let first = fx
            .provider
            .add(&AddRequest::new(gpu.clone()))
            .await
            .unwrap();
        if api == Api::Cm {
            assert!(matches!(first, cro_runtime::AddOutcome::InProgress(_)));
            fx.sim.complete_pending();
        }
        let (serial, uuid) = match first {
            cro_runtime::AddOutcome::Attached(d) => (d.device_id, d.fabric_device_id),
            cro_runtime::AddOutcome::InProgress(_) => {
                attached(fx.provider.add(&AddRequest::new(gpu.clone())).await)
            }
        };
        gpu.device_id = Some(serial);
        gpu.fabric_device_id = Some(uuid);
        for _ in 0..3 {
            fx.provider.check_resource(&gpu).await.unwrap();
        }
        assert_eq!(fx.provider.list(&[]).await.unwrap().len(), 1);
        let removed = fx.provider.remove_resource(&gpu).await.unwrap();
        if api == Api::Cm {
            assert!(matches!(removed, RemoveOutcome::InProgress(_)));
        }

        let requests = fx.sim.requests();
        assert_eq!(fx.sim.token_requests().len(), 1, "{api:?}");
        let tokens = bearers(&requests);
        assert!(tokens.len() >= 7, "{api:?}: {} fabric calls", tokens.len());
        assert!(
            tokens.iter().all(|t| *t == tokens[0]),
            "{api:?}: tokens differ"
        );
        let grant = &fx.sim.token_requests()[0];
        assert_eq!(grant.form_value("grant_type").as_deref(), Some("password"));
        assert_eq!(grant.form_value("scope").as_deref(), Some("openid"));
        assert_eq!(
            grant.form_value("response_type").as_deref(),
            Some("id_token token")
        );
        assert_eq!(
            grant.form_value("username"),
            Some(fx.sim.credentials().username)
        );
        assert_eq!(
            grant.form_value("client_secret"),
            Some(fx.sim.credentials().client_secret)
        );
    }
}

#[tokio::test]
async fn a_new_token_is_fetched_only_from_thirty_seconds_before_exp() {
    let clock = TestClock::default();
    let fx = Fixture::builder(Api::Fm)
        .with_clock(clock.clone())
        .with_sim_config(|c| c.with_token_ttl(Duration::from_secs(300)))
        .start()
        .await;
    fx.sim.add_free_devices("gpu", MODEL, 1);
    let node = "worker-0";
    fx.add_provider_id_node(node);
    let (serial, _) = attached(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", node)))
            .await,
    );
    let mut gpu = fx.gpu("gpu-a", node);
    gpu.device_id = Some(serial);

    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.token_requests().len(), 1);

    // 31 s before exp: the cached token is still used.
    clock.advance(Duration::from_secs(269));
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.token_requests().len(), 1);

    // 30 s before exp: renewed, and the new one is used from then on.
    clock.advance(Duration::from_secs(1));
    fx.provider.check_resource(&gpu).await.unwrap();
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.token_requests().len(), 2);
    let tokens = bearers(&fx.sim.requests());
    let (first, last) = (&tokens[0], &tokens[tokens.len() - 1]);
    assert_ne!(first, last);
    assert_eq!(&tokens[tokens.len() - 2], last);
    assert_eq!(tokens.iter().filter(|t| *t == first).count(), 3);
}

#[tokio::test]
async fn rejected_credentials_are_a_clear_error() {
    let fx = Fixture::builder(Api::Fm).start().await;
    fx.add_provider_id_node("worker-0");
    let gpu = fx.gpu("gpu-a", "worker-0");

    fx.sim.inject(Fault::RejectCredentials.on(Route::Token));
    let e = provider_error(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    assert!(
        matches!(&e, ProviderError::Config(m) if m.contains("credentials rejected") && m.contains("Invalid user credentials")),
        "{e:?}"
    );

    // A wrong password in the granted Secret: the same.
    let creds = fx.sim.credentials();
    fx.cluster.insert_secret(
        SECRET_NAMESPACE,
        SECRET_NAME,
        [
            ("username", creds.username),
            ("password", "not-the-password".to_string()),
            ("client_id", creds.client_id),
            ("client_secret", creds.client_secret),
            ("realm", fx.sim.realm().to_string()),
        ],
    );
    let e = provider_error(fx.provider.add(&AddRequest::new(gpu.clone())).await);
    assert!(
        matches!(&e, ProviderError::Config(m) if m.contains("credentials rejected")),
        "{e:?}"
    );
    assert!(fx.sim.requests_to(Route::FmAttach).is_empty());
}

#[tokio::test]
async fn expired_or_revoked_tokens() {
    let fx = Fixture::builder(Api::Fm).start().await;
    fx.sim.add_free_devices("gpu", MODEL, 1);
    fx.add_provider_id_node("worker-0");
    let (serial, _) = attached(
        fx.provider
            .add(&AddRequest::new(fx.gpu("gpu-a", "worker-0")))
            .await,
    );
    let mut gpu = fx.gpu("gpu-a", "worker-0");
    gpu.device_id = Some(serial);

    // The identity manager restarted: the cached token is refused, one new one is fetched.
    fx.sim.revoke_tokens();
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.token_requests().len(), 2);
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.token_requests().len(), 2);

    // A token issued already expired is used once, refused, and not cached.
    fx.sim.revoke_tokens();
    fx.sim
        .inject(Fault::ExpiredTokens.on(Route::Token).times(2));
    let e = fabric_error(fx.provider.check_resource(&gpu).await);
    assert_eq!(
        (e.status, e.code.as_str()),
        (401, fabric_sim::codes::UNAUTHORIZED)
    );
    fx.provider.check_resource(&gpu).await.unwrap_err();
    fx.provider.check_resource(&gpu).await.unwrap();
    assert_eq!(fx.sim.token_requests().len(), 5);
}
