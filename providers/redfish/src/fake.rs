//! A tiny in-memory Redfish composition service behind the SDK's `TestHost`, for the
//! unit tests of the decision logic (the real simulator is simulators/redfish, used by
//! tests/provider-it).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::{Value, json};

use cro_provider_sdk::testing::TestHost;
use cro_provider_sdk::{HttpRequest, HttpResponse, Method};

#[derive(Default)]
pub struct Service {
    /// block id -> (type, model, serial, state, system).
    pub blocks: BTreeMap<String, (String, String, String, String, Option<String>)>,
    /// system id -> blocks.
    pub systems: BTreeMap<String, Vec<String>>,
    pub patches: usize,
    /// Answer the next PATCH with this status (after acting when `act`).
    pub next_patch: Option<(u16, bool)>,
}

const B: &str = "/redfish/v1/CompositionService/ResourceBlocks";

fn ok(v: Value) -> HttpResponse {
    HttpResponse {
        status: 200,
        headers: Vec::new(),
        body: v.to_string().into_bytes(),
    }
}

impl Service {
    pub fn gpu(&mut self, id: &str, model: &str) {
        self.blocks.insert(
            id.into(),
            (
                "Processor".into(),
                model.into(),
                format!("GPU-{id}"),
                "Unused".into(),
                None,
            ),
        );
    }

    pub fn system(&mut self, id: &str) {
        self.systems.insert(id.into(), Vec::new());
    }

    fn handle(&mut self, r: &HttpRequest) -> HttpResponse {
        let path = r.url.trim_start_matches("http://bmc");
        if r.method == Method::Post {
            return HttpResponse {
                status: 201,
                headers: vec![("X-Auth-Token".into(), "t".into())],
                body: b"{}".to_vec(),
            };
        }
        if path == B {
            return self.block_collection();
        }
        if let Some(rest) = path.strip_prefix(&format!("{B}/")) {
            return self.block_or_device(rest);
        }
        if let Some(id) = path.strip_prefix("/redfish/v1/Systems/") {
            if r.method == Method::Patch {
                return self.patch_system(id, r);
            }
            return self.get_system(id);
        }
        panic!("unexpected {path}");
    }

    fn block_collection(&self) -> HttpResponse {
        let members: Vec<_> = self
            .blocks
            .keys()
            .map(|k| json!({"@odata.id": format!("{B}/{k}")}))
            .collect();
        ok(json!({"Members": members}))
    }

    /// `rest` is "<block>" (the block) or "<block>/<...>" (its device).
    fn block_or_device(&self, rest: &str) -> HttpResponse {
        let (id, device) = match rest.split_once('/') {
            Some((id, _)) => (id, true),
            None => (rest, false),
        };
        let Some((t, model, serial, state, system)) = self.blocks.get(id) else {
            return HttpResponse {
                status: 404,
                headers: Vec::new(),
                body: b"{}".to_vec(),
            };
        };
        if device {
            return ok(json!({"Model": model, "SerialNumber": serial}));
        }
        let systems: Vec<_> = system
            .iter()
            .map(|s| json!({"@odata.id": format!("/redfish/v1/Systems/{s}")}))
            .collect();
        ok(
            json!({"Id": id, "ResourceBlockType": [t], "Status": {"Health": "OK"},
            "CompositionStatus": {"CompositionState": state},
            "Links": {"ComputerSystems": systems},
            "Processors": [{"@odata.id": format!("{B}/{id}/Processors/GPU0")}]}),
        )
    }

    /// Composes exactly the PATCH's blocks into the system (unless `next_patch` says
    /// not to act), answering `next_patch`'s status or 200.
    fn patch_system(&mut self, id: &str, r: &HttpRequest) -> HttpResponse {
        self.patches += 1;
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let wanted: Vec<String> = body["Links"]["ResourceBlocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                l["@odata.id"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let (status, act) = self.next_patch.take().unwrap_or((200, true));
        if act {
            for b in &wanted {
                let e = self.blocks.get_mut(b).unwrap();
                e.3 = "Composed".into();
                e.4 = Some(id.into());
            }
            self.systems.insert(id.into(), wanted);
        }
        HttpResponse {
            status,
            headers: Vec::new(),
            body: b"{}".to_vec(),
        }
    }

    fn get_system(&self, id: &str) -> HttpResponse {
        let links: Vec<_> = self.systems[id]
            .iter()
            .map(|b| json!({"@odata.id": format!("{B}/{b}")}))
            .collect();
        ok(json!({"Id": id, "@odata.etag": "W/\"1\"", "Links": {"ResourceBlocks": links}}))
    }

    /// A host whose HTTP is this service.
    pub fn host(svc: &Rc<RefCell<Service>>) -> TestHost {
        let host = TestHost::new()
            .with_config("endpoint", "http://bmc")
            .with_secret("username", "u")
            .with_secret("password", "p")
            .with_node(
                "w0",
                r#"{"metadata": {"name": "w0"}, "spec": {"providerID": "redfish://s0"}}"#,
            );
        let svc = svc.clone();
        host.on_http(move |r| Ok(svc.borrow_mut().handle(r)));
        host
    }
}
