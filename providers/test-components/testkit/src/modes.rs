//! Target-independent parts of the testkit (kept native so they are unit-testable).

/// The prefix of a resource model that overrides the configured mode for one call.
pub const MODE_PREFIX: &str = "mode:";

/// A call's mode and config overrides, from a model `mode:<name>(;<key>=<value>)*`.
pub fn parse_model(model: &str) -> Option<(&str, Vec<(&str, &str)>)> {
    let rest = model.strip_prefix(MODE_PREFIX)?;
    let mut parts = rest.split(';');
    let mode = parts.next()?;
    let overrides = parts.filter_map(|kv| kv.split_once('=')).collect();
    Some((mode, overrides))
}

/// The mode for a call: the resource's `mode:<name>` model, else the config's `mode`,
/// else `fake`.
pub fn select<'a>(model: Option<&'a str>, configured: Option<&'a str>) -> &'a str {
    model
        .and_then(parse_model)
        .map(|(mode, _)| mode)
        .or(configured)
        .unwrap_or("fake")
}

/// One device of the fake fabric, stored as a tab-separated line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDevice {
    pub name: String,
    pub node: String,
    pub gpu: bool,
    pub model: String,
    pub device_id: String,
    pub fabric_device_id: String,
}

impl FakeDevice {
    pub fn encode(&self) -> String {
        [
            self.name.as_str(),
            self.node.as_str(),
            if self.gpu { "gpu" } else { "cxlmemory" },
            self.model.as_str(),
            self.device_id.as_str(),
            self.fabric_device_id.as_str(),
        ]
        .join("\t")
    }

    pub fn decode(line: &str) -> Option<FakeDevice> {
        let mut parts = line.split('\t');
        let device = FakeDevice {
            name: parts.next()?.to_string(),
            node: parts.next()?.to_string(),
            gpu: parts.next()? == "gpu",
            model: parts.next()?.to_string(),
            device_id: parts.next()?.to_string(),
            fabric_device_id: parts.next()?.to_string(),
        };
        parts.next().is_none().then_some(device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_overrides_config() {
        assert_eq!(select(Some("mode:loop"), Some("http")), "loop");
        assert_eq!(select(Some("A100"), Some("http")), "http");
        assert_eq!(select(Some("A100"), None), "fake");
        assert_eq!(select(None, None), "fake");
    }

    #[test]
    fn models_carry_overrides() {
        assert_eq!(
            parse_model("mode:state;op=get;key=token"),
            Some(("state", vec![("op", "get"), ("key", "token")]))
        );
        assert_eq!(parse_model("mode:loop"), Some(("loop", vec![])));
        assert_eq!(parse_model("A100"), None);
        assert_eq!(select(Some("mode:state;op=get"), None), "state");
    }

    #[test]
    fn device_round_trips() {
        let d = FakeDevice {
            name: "gpu-1".into(),
            node: "worker-0".into(),
            gpu: true,
            model: "A100".into(),
            device_id: "GPU-1".into(),
            fabric_device_id: "fab-1".into(),
        };
        assert_eq!(FakeDevice::decode(&d.encode()), Some(d));
        assert_eq!(FakeDevice::decode("a\tb"), None);
        assert_eq!(FakeDevice::decode("a\tb\tgpu\tm\td\tf\textra"), None);
    }
}
