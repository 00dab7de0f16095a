//! The space `ringtier tune` sweeps: io_uring set-up knobs and block-layer settings, each
//! with a list of values, from a TOML file (`[uring]` and `[block]` tables, or flat keys) or
//! `--knob NAME=V1,V2` flags. An unknown knob or a value that does not parse is an error
//! naming it and the known ones. The sweep is one knob at a time around a baseline (the
//! engine's defaults and the device's current block settings), or every combination.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// Where a knob acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layer {
    /// The io_uring engine (`UringConfig`, the read size, O_DIRECT).
    Uring,
    /// The block device's request queue (`/sys/block/DEV/queue/NAME`).
    Block,
}

/// One knob: its name, layer, the engine's default (the baseline; `None` for block knobs,
/// whose baseline is the device's current value) and what its values look like.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KnobSpec {
    pub(crate) name: &'static str,
    pub(crate) layer: Layer,
    pub(crate) default: Option<&'static str>,
    pub(crate) values: &'static str,
}

/// Every knob `tune` knows.
pub(crate) const KNOBS: &[KnobSpec] = &[
    KnobSpec { name: "io", layer: Layer::Uring, default: Some("direct"), values: "direct | buffered" },
    KnobSpec {
        name: "depth",
        layer: Layer::Uring,
        default: Some("32"),
        values: "requests in flight per ring, 1..=4096",
    },
    KnobSpec { name: "rings", layer: Layer::Uring, default: Some("1"), values: "driver threads, 1..=64" },
    KnobSpec {
        name: "read_size",
        layer: Layer::Uring,
        default: Some("0"),
        values: "largest single read (fio --bs), e.g. 128k; 0 = whole files",
    },
    KnobSpec { name: "sqpoll", layer: Layer::Uring, default: Some("off"), values: "off | idle milliseconds" },
    KnobSpec { name: "coop_taskrun", layer: Layer::Uring, default: Some("false"), values: "true | false" },
    KnobSpec {
        name: "defer_taskrun",
        layer: Layer::Uring,
        default: Some("false"),
        values: "true | false (with SINGLE_ISSUER)",
    },
    KnobSpec { name: "register_buffers", layer: Layer::Uring, default: Some("true"), values: "true | false" },
    KnobSpec { name: "register_files", layer: Layer::Uring, default: Some("false"), values: "true | false" },
    KnobSpec { name: "scheduler", layer: Layer::Block, default: None, values: "none | mq-deadline | kyber | bfq" },
    KnobSpec { name: "nr_requests", layer: Layer::Block, default: None, values: "queue slots, e.g. 64" },
    KnobSpec { name: "read_ahead_kb", layer: Layer::Block, default: None, values: "KiB, e.g. 128" },
    KnobSpec { name: "nomerges", layer: Layer::Block, default: None, values: "0 | 1 | 2" },
    KnobSpec { name: "rq_affinity", layer: Layer::Block, default: None, values: "0 | 1 | 2" },
    KnobSpec { name: "max_sectors_kb", layer: Layer::Block, default: None, values: "KiB, e.g. 512" },
];

fn spec(name: &str) -> Result<&'static KnobSpec> {
    KNOBS.iter().find(|k| k.name == name).with_context(|| {
        format!("unknown knob `{name}` (known: {})", KNOBS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "))
    })
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "true" | "on" | "1" | "yes" => Some(true),
        "false" | "off" | "0" | "no" => Some(false),
        _ => None,
    }
}

/// Checks and normalizes one value of `knob`.
fn normalize(knob: &KnobSpec, raw: &str) -> Result<String> {
    let v = raw.trim();
    let bad = || anyhow::anyhow!("knob `{}`: {v:?} is not a valid value ({})", knob.name, knob.values);
    let int = |lo: u64, hi: u64| -> Result<String> {
        let n: u64 = v.parse().map_err(|_| bad())?;
        if !(lo..=hi).contains(&n) {
            return Err(bad());
        }
        Ok(n.to_string())
    };
    match knob.name {
        "io" => match v {
            "direct" | "buffered" => Ok(v.to_string()),
            _ => Err(bad()),
        },
        "depth" => int(1, 4096),
        "rings" => int(1, 64),
        "read_size" => {
            let n = crate::parse_size(v).map_err(|_| bad())?;
            if n != 0 && (n % 4096 != 0 || n > (1 << 30)) {
                bail!("knob `read_size`: {v:?} must be 0 or a multiple of 4 KiB up to 1 GiB");
            }
            Ok(n.to_string())
        }
        "sqpoll" => match v {
            "off" | "false" => Ok("off".to_string()),
            _ => int(0, 60_000),
        },
        "coop_taskrun" | "defer_taskrun" | "register_buffers" | "register_files" => {
            parse_bool(v).map(|b| b.to_string()).ok_or_else(bad)
        }
        "scheduler" => {
            if v.is_empty() || v.len() > 32 || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(bad());
            }
            Ok(v.to_string())
        }
        "nr_requests" => int(1, 1 << 16),
        "read_ahead_kb" | "max_sectors_kb" => int(0, 1 << 24),
        "nomerges" | "rq_affinity" => int(0, 2),
        _ => Err(bad()),
    }
}

/// How the space is walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Sweep {
    /// The baseline, then each knob's other values with the rest at the baseline.
    OneAtATime,
    /// Every combination (the product of the lists).
    Full,
}

/// Knob name -> values to try, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Space {
    pub(crate) values: BTreeMap<&'static str, Vec<String>>,
}

/// One configuration: a value for every knob set (block knobs absent = left as they are).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub(crate) struct Config(pub(crate) BTreeMap<&'static str, String>);

impl Config {
    /// The value of `knob` (its default when unset).
    pub(crate) fn get(&self, knob: &str) -> Option<&str> {
        self.0.get(knob).map(String::as_str).or_else(|| KNOBS.iter().find(|k| k.name == knob)?.default)
    }

    /// A boolean knob.
    pub(crate) fn flag(&self, knob: &str) -> bool {
        self.get(knob).and_then(parse_bool).unwrap_or(false)
    }

    /// A numeric knob (0 when unset or `off`).
    pub(crate) fn num(&self, knob: &str) -> u64 {
        self.get(knob).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// SQPOLL's idle time, when on.
    pub(crate) fn sqpoll(&self) -> Option<u32> {
        self.get("sqpoll").filter(|v| *v != "off").and_then(|v| v.parse().ok())
    }

    /// The block settings of this configuration, `(name, value)`.
    pub(crate) fn block(&self) -> Vec<(&'static str, String)> {
        self.0
            .iter()
            .filter(|(k, _)| spec(k).map(|s| s.layer == Layer::Block).unwrap_or(false))
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// Why the kernel would refuse this combination, if it would.
    pub(crate) fn invalid(&self) -> Option<String> {
        if self.sqpoll().is_some() && (self.flag("coop_taskrun") || self.flag("defer_taskrun")) {
            return Some("SQPOLL cannot be combined with COOP_TASKRUN or DEFER_TASKRUN".into());
        }
        None
    }

    /// The differences from the engine's defaults, `depth=64 sqpoll=50` (`defaults` when none).
    pub(crate) fn label(&self) -> String {
        let parts: Vec<String> = self
            .0
            .iter()
            .filter(|(k, v)| spec(k).ok().and_then(|s| s.default) != Some(v.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if parts.is_empty() {
            "defaults".to_string()
        } else {
            parts.join(" ")
        }
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl Space {
    /// Adds values of one knob (checked), replacing earlier ones.
    pub(crate) fn set(&mut self, name: &str, raw: &[String]) -> Result<()> {
        let knob = spec(name)?;
        if raw.is_empty() {
            bail!("knob `{name}` has no values");
        }
        let mut vals = Vec::new();
        for r in raw {
            let v = normalize(knob, r)?;
            if !vals.contains(&v) {
                vals.push(v);
            }
        }
        self.values.insert(knob.name, vals);
        Ok(())
    }

    /// `NAME=V1,V2` from the command line.
    pub(crate) fn set_flag(&mut self, flag: &str) -> Result<()> {
        let (name, vals) =
            flag.split_once('=').with_context(|| format!("--knob {flag:?}: expected NAME=VALUE[,VALUE...]"))?;
        let vals: Vec<String> = vals.split(',').map(str::to_string).collect();
        self.set(name.trim(), &vals)
    }

    /// Reads a TOML space: `[uring]` and `[block]` tables, or knobs at the top level; each
    /// knob a value or a list. A knob in the wrong table is an error too.
    pub(crate) fn from_toml(text: &str) -> Result<(Space, Option<Sweep>)> {
        let table: toml::Table = text.parse().context("parsing the space (TOML)")?;
        let mut space = Space::default();
        let mut sweep = None;
        for (key, value) in &table {
            match (key.as_str(), value) {
                ("sweep", toml::Value::String(s)) => {
                    sweep = Some(match s.as_str() {
                        "one-at-a-time" => Sweep::OneAtATime,
                        "full" => Sweep::Full,
                        other => bail!("sweep = {other:?}: expected \"one-at-a-time\" or \"full\""),
                    })
                }
                ("uring" | "block", toml::Value::Table(t)) => {
                    let layer = if key == "uring" { Layer::Uring } else { Layer::Block };
                    for (k, v) in t {
                        let s = spec(k).with_context(|| format!("in [{key}]"))?;
                        if s.layer != layer {
                            bail!(
                                "knob `{k}` belongs in [{}], not [{key}]",
                                if layer == Layer::Uring { "block" } else { "uring" }
                            );
                        }
                        space.set(k, &toml_values(k, v)?)?;
                    }
                }
                (k, v) => space.set(k, &toml_values(k, v)?)?,
            }
        }
        Ok((space, sweep))
    }

    /// The configurations to run: the baseline first.
    pub(crate) fn configs(&self, sweep: Sweep) -> Vec<Config> {
        let baseline =
            Config(self.values.keys().filter_map(|k| spec(k).ok()?.default.map(|d| (*k, d.to_string()))).collect());
        let mut out = vec![baseline.clone()];
        match sweep {
            Sweep::OneAtATime => {
                for (k, vals) in &self.values {
                    for v in vals {
                        let mut c = baseline.clone();
                        c.0.insert(k, v.clone());
                        if !out.contains(&c) {
                            out.push(c);
                        }
                    }
                }
            }
            Sweep::Full => {
                let mut all = vec![BTreeMap::new()];
                for (k, vals) in &self.values {
                    all = all
                        .into_iter()
                        .flat_map(|m: BTreeMap<&'static str, String>| {
                            vals.iter().map(move |v| {
                                let mut m = m.clone();
                                m.insert(*k, v.clone());
                                m
                            })
                        })
                        .collect();
                }
                for m in all {
                    let c = Config(m);
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
            }
        }
        out
    }
}

fn toml_values(knob: &str, v: &toml::Value) -> Result<Vec<String>> {
    let one = |v: &toml::Value| -> Result<String> {
        Ok(match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => bail!("knob `{knob}`: {other} is not a string, integer or boolean"),
        })
    };
    match v {
        toml::Value::Array(a) => a.iter().map(one).collect(),
        v => Ok(vec![one(v)?]),
    }
}

/// The default sweep (`docs/TUNE.md`): the io_uring knobs one at a time around the engine's
/// defaults, and the block settings where the device lets them be written.
pub(crate) fn default_space(quick: bool) -> Space {
    let mut s = Space::default();
    let set = |s: &mut Space, k: &str, v: &[&str]| {
        s.set(k, &v.iter().map(|x| x.to_string()).collect::<Vec<_>>()).expect("built-in space is valid")
    };
    if quick {
        set(&mut s, "depth", &["4", "32", "128"]);
        set(&mut s, "io", &["direct", "buffered"]);
        set(&mut s, "sqpoll", &["off", "50"]);
        set(&mut s, "coop_taskrun", &["false", "true"]);
        set(&mut s, "defer_taskrun", &["false", "true"]);
        set(&mut s, "scheduler", &["none"]);
        set(&mut s, "nomerges", &["2"]);
    } else {
        set(&mut s, "depth", &["1", "4", "16", "32", "64", "128"]);
        set(&mut s, "rings", &["1", "2"]);
        set(&mut s, "io", &["direct", "buffered"]);
        set(&mut s, "read_size", &["0", "64k"]);
        set(&mut s, "sqpoll", &["off", "50"]);
        set(&mut s, "coop_taskrun", &["false", "true"]);
        set(&mut s, "defer_taskrun", &["false", "true"]);
        set(&mut s, "register_buffers", &["true", "false"]);
        set(&mut s, "register_files", &["false", "true"]);
        set(&mut s, "scheduler", &["none", "mq-deadline", "kyber"]);
        set(&mut s, "nr_requests", &["64"]);
        set(&mut s, "read_ahead_kb", &["128"]);
        set(&mut s, "nomerges", &["2"]);
        set(&mut s, "rq_affinity", &["2"]);
        set(&mut s, "max_sectors_kb", &["512"]);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_knob_is_an_error_naming_it_and_the_known_ones() {
        let err = Space::from_toml("[uring]\ndepht = [1, 2]\n").expect_err("typo");
        let msg = format!("{err:#}");
        assert!(msg.contains("unknown knob `depht`") && msg.contains("depth") && msg.contains("[uring]"), "{msg}");
        let err = Space::default().set_flag("qd=4").expect_err("unknown");
        assert!(err.to_string().contains("unknown knob `qd`"), "{err}");
        let err = Space::from_toml("[block]\ndepth = 4\n").expect_err("wrong table");
        assert!(err.to_string().contains("belongs in [uring]"), "{err}");
        let err = Space::default().set_flag("depth=0").expect_err("bad value");
        assert!(err.to_string().contains("not a valid value"), "{err}");
        assert!(Space::default().set_flag("read_size=1000").is_err());
        assert!(Space::default().set_flag("scheduler=../../x").is_err());
        assert!(Space::default().set_flag("depth").is_err());
    }

    #[test]
    fn toml_and_flags_give_the_same_space_and_sweeps_start_at_the_baseline() {
        let (t, sweep) = Space::from_toml(
            "sweep = \"full\"\n[uring]\ndepth = [8, 32]\nsqpoll = [\"off\", 20]\n[block]\nscheduler = \"none\"\n",
        )
        .expect("toml");
        assert_eq!(sweep, Some(Sweep::Full));
        let mut f = Space::default();
        for flag in ["depth=8,32", "sqpoll=off,20", "scheduler=none"] {
            f.set_flag(flag).expect("flag");
        }
        assert_eq!(t, f);
        let one = t.configs(Sweep::OneAtATime);
        assert_eq!(one[0].label(), "defaults");
        // Baseline, depth 8, sqpoll 20, scheduler none (depth 32 and sqpoll off are the baseline).
        assert_eq!(one.len(), 4, "{one:?}");
        assert_eq!(one[1].label(), "depth=8");
        assert!(one[0].block().is_empty(), "block knobs stay as they are in the baseline");
        let full = t.configs(Sweep::Full);
        assert_eq!(full.len(), 1 + 2 * 2, "{full:?}");
        let bad = Config([("sqpoll", "50".to_string()), ("defer_taskrun", "true".to_string())].into_iter().collect());
        assert!(bad.invalid().is_some());
        assert_eq!(bad.sqpoll(), Some(50));
        assert!(default_space(true).configs(Sweep::OneAtATime).len() >= 6);
    }
}
