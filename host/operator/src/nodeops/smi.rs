//! Parsing what `nvidia-smi` and the driver's proc files print (docs/node-operations.md). Every
//! function takes text from a node and returns a typed error on anything unexpected.

use std::fmt;

/// What a node with no GPU prints, on stdout, possibly with a non-zero exit.
const NO_DEVICES: &str = "No devices were found";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmiError {
    #[error("unexpected nvidia-smi line {line:?}: {why}")]
    BadLine { line: String, why: &'static str },
    #[error("bad PCI bus id {0:?}")]
    BadBusId(String),
    #[error("unexpected drain state output {0:?}")]
    BadDrainState(String),
    #[error("GPU information file lacks {0}")]
    MissingField(&'static str),
}

/// A PCI address as nvidia-smi, the device plugin and sysfs spell it differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BusId {
    pub(crate) domain: u32,
    pub(crate) bus: u8,
    pub(crate) device: u8,
    pub(crate) function: u8,
}

impl BusId {
    /// Accepts `00000000:3B:00.0` (nvidia-smi), `0000:3b:00.0` (sysfs) or `3B:00.0`.
    pub(crate) fn parse(text: &str) -> Result<Self, SmiError> {
        let bad = || SmiError::BadBusId(text.to_owned());
        let t = text.trim();
        let (domain, rest) = match t.matches(':').count() {
            2 => {
                let (d, r) = t.split_once(':').ok_or_else(bad)?;
                (u32::from_str_radix(d, 16).map_err(|_| bad())?, r)
            }
            1 => (0, t),
            _ => return Err(bad()),
        };
        let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let hex8 = |s: &str| {
            if s.is_empty() || s.len() > 2 {
                return Err(bad());
            }
            u8::from_str_radix(s, 16).map_err(|_| bad())
        };
        let (bus, device, function) = (hex8(bus)?, hex8(device)?, hex8(function)?);
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(Self {
            domain,
            bus,
            device,
            function,
        })
    }

    /// `00000000:3B:00.0`, the form `nvidia-smi drain -p` takes.
    pub(crate) fn smi(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `0000:3B:00.0`: the device-plugin path strips the leading `0000` of the smi form.
    pub(crate) fn short_upper(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `0000:3b:00.0`, the name under `/sys/bus/pci/devices/`.
    pub(crate) fn sysfs(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Display for BusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.smi())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gpu {
    pub(crate) minor: u32,
    pub(crate) uuid: String,
    pub(crate) bus_id: BusId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ComputeApp {
    pub(crate) gpu_uuid: String,
    pub(crate) process_name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DrainState {
    Draining,
    NotDraining,
}

fn data_lines(output: &str) -> impl Iterator<Item = &str> {
    output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains(NO_DEVICES))
}

fn fields(line: &str) -> Vec<&str> {
    line.split(',').map(str::trim).collect()
}

fn check_uuid<'a>(uuid: &'a str, line: &str) -> Result<&'a str, SmiError> {
    if uuid.starts_with("GPU-") || uuid.starts_with("MIG-") {
        Ok(uuid)
    } else {
        Err(SmiError::BadLine {
            line: line.to_owned(),
            why: "expected a GPU UUID",
        })
    }
}

/// `nvidia-smi --query-gpu=gpu_uuid --format=csv,noheader,nounits`.
#[cfg(test)]
pub(crate) fn parse_gpu_uuids(output: &str) -> Result<Vec<String>, SmiError> {
    data_lines(output)
        .map(|line| check_uuid(line, line).map(str::to_owned))
        .collect()
}

/// `nvidia-smi --query-gpu=device_minor,gpu_uuid,pci.bus_id --format=csv,noheader,nounits`.
pub(crate) fn parse_gpus(output: &str) -> Result<Vec<Gpu>, SmiError> {
    data_lines(output)
        .map(|line| {
            let f = fields(line);
            let [minor, uuid, bus] = f.as_slice() else {
                return Err(SmiError::BadLine {
                    line: line.to_owned(),
                    why: "expected 3 fields: device_minor, gpu_uuid, pci.bus_id",
                });
            };
            let minor = minor.parse().map_err(|_| SmiError::BadLine {
                line: line.to_owned(),
                why: "device_minor is not a number",
            })?;
            Ok(Gpu {
                minor,
                uuid: check_uuid(uuid, line)?.to_owned(),
                bus_id: BusId::parse(bus)?,
            })
        })
        .collect()
}

/// `nvidia-smi --query-compute-apps=gpu_uuid,process_name --format=csv,noheader,nounits`.
/// Empty output means no work.
pub(crate) fn parse_compute_apps(output: &str) -> Result<Vec<ComputeApp>, SmiError> {
    data_lines(output)
        .map(|line| {
            // A process name may itself contain ", "; only the first comma separates.
            let (uuid, name) = line.split_once(',').ok_or_else(|| SmiError::BadLine {
                line: line.to_owned(),
                why: "expected gpu_uuid, process_name",
            })?;
            Ok(ComputeApp {
                gpu_uuid: check_uuid(uuid.trim(), line)?.to_owned(),
                process_name: name.trim().to_owned(),
            })
        })
        .collect()
}

/// `nvidia-smi drain -p <bus> -q`.
pub(crate) fn parse_drain_state(output: &str) -> Result<DrainState, SmiError> {
    let lower = output.to_ascii_lowercase();
    // "not draining" contains "draining", so it must be looked for first.
    if lower.contains("not draining") {
        Ok(DrainState::NotDraining)
    } else if lower.contains("draining") {
        Ok(DrainState::Draining)
    } else {
        Err(SmiError::BadDrainState(output.trim().to_owned()))
    }
}

/// The module names `lsmod` lists (its first column, after the header line).
pub(crate) fn parse_lsmod(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "Module")
        .map(str::to_owned)
        .collect()
}

/// `/proc/driver/nvidia/gpus/<bus id>/information` of a host driver.
pub(crate) fn parse_proc_information(text: &str) -> Result<Gpu, SmiError> {
    let mut minor = None;
    let mut uuid = None;
    let mut bus = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "Device Minor" => minor = value.parse::<u32>().ok(),
            "GPU UUID" => uuid = Some(value.to_owned()),
            "Bus Location" => bus = Some(BusId::parse(value)?),
            _ => {}
        }
    }
    let uuid = uuid.ok_or(SmiError::MissingField("GPU UUID"))?;
    check_uuid(&uuid, text)?;
    Ok(Gpu {
        minor: minor.ok_or(SmiError::MissingField("Device Minor"))?,
        uuid,
        bus_id: bus.ok_or(SmiError::MissingField("Bus Location"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID_A: &str = "GPU-5d3c8b0a-1111-2222-3333-444455556666";
    const UUID_B: &str = "GPU-9a9a9a9a-1111-2222-3333-444455556666";

    #[test]
    fn bus_id_spellings() {
        let b = BusId::parse("00000000:3B:00.0").unwrap();
        assert_eq!(b.smi(), "00000000:3B:00.0");
        assert_eq!(b.short_upper(), "0000:3B:00.0");
        assert_eq!(b.sysfs(), "0000:3b:00.0");
        assert_eq!(BusId::parse("0000:3b:00.0").unwrap(), b);
        assert_eq!(BusId::parse("3B:00.0").unwrap(), b);
        for bad in [
            "",
            "3B",
            "zz:00.0",
            "0000:3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "1:2:3:4.0",
            "0000:3bb:00.0",
        ] {
            assert!(BusId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn gpu_list_with_and_without_devices() {
        let out = format!("0, {UUID_A}, 00000000:3B:00.0\n1, {UUID_B}, 00000000:86:00.0\n");
        let gpus = parse_gpus(&out).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[1].minor, 1);
        assert_eq!(gpus[1].uuid, UUID_B);
        assert_eq!(gpus[1].bus_id.sysfs(), "0000:86:00.0");
        assert!(parse_gpus("No devices were found\n").unwrap().is_empty());
        assert!(parse_gpus("").unwrap().is_empty());
        assert_eq!(
            parse_gpu_uuids(&format!("{UUID_A}\n{UUID_B}\n")).unwrap(),
            vec![UUID_A, UUID_B]
        );
    }

    #[test]
    fn gpu_list_errors() {
        assert!(parse_gpus("0, GPU-x").is_err());
        assert!(parse_gpus(&format!("x, {UUID_A}, 00000000:3B:00.0")).is_err());
        assert!(parse_gpus("0, not-a-uuid, 00000000:3B:00.0").is_err());
        assert!(parse_gpu_uuids("NVIDIA-SMI has failed because it couldn't communicate").is_err());
    }

    #[test]
    fn compute_apps() {
        assert!(parse_compute_apps("").unwrap().is_empty());
        assert!(parse_compute_apps("\n  \n").unwrap().is_empty());
        let apps = parse_compute_apps(&format!(
            "{UUID_A}, python3\n{UUID_B}, /usr/bin/my app, v2\n"
        ))
        .unwrap();
        assert_eq!(
            apps[0],
            ComputeApp {
                gpu_uuid: UUID_A.into(),
                process_name: "python3".into()
            }
        );
        assert_eq!(apps[1].process_name, "/usr/bin/my app, v2");
        assert!(parse_compute_apps("garbage").is_err());
    }

    #[test]
    fn drain_state() {
        assert_eq!(
            parse_drain_state("GPU 00000000:3B:00.0: not draining\n").unwrap(),
            DrainState::NotDraining
        );
        assert_eq!(
            parse_drain_state("GPU 00000000:3B:00.0: draining").unwrap(),
            DrainState::Draining
        );
        assert!(parse_drain_state("").is_err());
        assert!(parse_drain_state("Unknown Error").is_err());
    }

    #[test]
    fn lsmod_module_names() {
        let out = "Module                  Size  Used by\nnvidia_uvm           1540096  0\nnvidia_drm             77824  0\nnvidia              56508416  2 nvidia_uvm,nvidia_modeset\n";
        assert_eq!(parse_lsmod(out), vec!["nvidia_uvm", "nvidia_drm", "nvidia"]);
        assert!(parse_lsmod("").is_empty());
    }

    #[test]
    fn proc_information() {
        let text = format!(
            "Model: \t\t NVIDIA A100-PCIE-40GB\nIRQ:   \t\t 160\nGPU UUID: \t {UUID_A}\nDevice Minor: \t 2\nBus Location: \t 0000:3b:00.0\n"
        );
        let gpu = parse_proc_information(&text).unwrap();
        assert_eq!(gpu.minor, 2);
        assert_eq!(gpu.uuid, UUID_A);
        assert_eq!(gpu.bus_id.smi(), "00000000:3B:00.0");
        assert_eq!(
            parse_proc_information("Model: x\n"),
            Err(SmiError::MissingField("GPU UUID"))
        );
    }
}
