use std::collections::HashMap;
use std::ffi::OsString;

use super::*;

#[test]
fn defaults_are_prrte_like_and_valid() {
    let c = Config::default();
    assert_eq!(c.radix, 64);
    assert_eq!(c.dvm_id, "tbon");
    assert!(c.ipv4 && !c.ipv6);
    assert_eq!(c.msg_max_bytes, 64 * 1024 * 1024);
    assert_eq!(
        (
            c.keepalive_idle_s,
            c.keepalive_interval_s,
            c.keepalive_count
        ),
        (60, 10, 6)
    );
    assert_eq!(c.port_range, None);
    assert!(c.if_include.is_empty());
    c.validate().unwrap();
    let r = c.relm();
    assert_eq!(
        (r.cache_ms, r.cache_max, r.unacked_max),
        (
            crate::limits::RELM_CACHE_MS_DEFAULT,
            crate::limits::RELM_CACHE_MAX_DEFAULT,
            crate::limits::RELM_UNACKED_MAX_DEFAULT
        )
    );
}

#[test]
fn names_match_env_and_descriptions() {
    assert_eq!(NAMES.len(), ENV_NAMES.len());
    for (name, env) in NAMES.iter().zip(ENV_NAMES) {
        assert_eq!(*env, format!("TBON_{}", name.to_ascii_uppercase()));
    }
    assert_eq!(Config::names(), NAMES);
    let settings = Config::settings();
    assert_eq!(settings.len(), NAMES.len());
    for (s, name) in settings.iter().zip(NAMES) {
        assert_eq!(s.name, *name);
        assert_eq!(s.env, format!("TBON_{}", name.to_ascii_uppercase()));
        // Every setting documents itself (a front end shows it, e.g. in --help).
        assert!(s.doc.trim().len() > 10, "{name} has no doc comment");
    }
    let kind = |n: &str| settings.iter().find(|s| s.name == n).map(|s| s.kind);
    assert_eq!(kind("ipv6"), Some(SettingKind::Bool));
    assert_eq!(kind("if_include"), Some(SettingKind::List));
    assert_eq!(kind("radix"), Some(SettingKind::Value));
}

#[test]
fn get_gives_back_what_set_takes() {
    let default = Config::default();
    for &name in Config::names() {
        // The default's text sets the default again.
        let mut c = Config::default();
        c.set(name, &default.get(name).unwrap()).unwrap();
        assert_eq!(c, default, "{name}");
        // A changed value's text sets the same value.
        let mut changed = Config::default();
        changed.set(name, non_default_value(name)).unwrap();
        let mut again = Config::default();
        again.set(name, &changed.get(name).unwrap()).unwrap();
        assert_eq!(again, changed, "{name}");
    }
    assert!(matches!(
        default.get("no_such"),
        Err(ConfigError::Unknown { .. })
    ));
}

/// A value for each setting that differs from its default, as text.
fn non_default_value(name: &str) -> &'static str {
    match name {
        "dvm_id" => "other.dvm",
        "ipv4" => "false",
        "insecure" => "true",
        "rejoin" => "on",
        "link_resend" | "bulk_connection" => "off",
        "key_file" => "/etc/tbon/job.key",
        "ipv6" => "yes",
        "port_range" => "20000-20100",
        "if_include" => "lo, 10.0.0.0/8",
        "if_exclude" => "eth9",
        "bulk_networks" => "10.78.0.0/16",
        "route" => "auto",
        "contacts" => "full",
        _ => "7",
    }
}

#[test]
fn every_setting_is_settable_by_each_spelling() {
    for &name in Config::names() {
        let value = non_default_value(name);
        let spellings = [
            name.to_string(),
            name.to_ascii_uppercase(),
            format!("TBON_{}", name.to_ascii_uppercase()),
            name.replace('_', "-"),
        ];
        let mut first = None;
        for spelling in spellings {
            let mut c = Config::default();
            c.set(&spelling, value).unwrap();
            assert_ne!(c, Config::default(), "{spelling}={value} changed nothing");
            assert_eq!(*first.get_or_insert_with(|| c.clone()), c);
        }
    }
}

#[test]
fn list_and_bool_values() {
    let mut c = Config::default();
    c.set("if_include", " lo, 10.0.0.0/8,,").unwrap();
    assert_eq!(
        c.if_include,
        vec!["lo".to_string(), "10.0.0.0/8".to_string()]
    );
    c.set("ipv6", "on").unwrap();
    assert!(c.ipv6);
    c.set("port_range", "").unwrap();
    assert_eq!(c.port_range, None);
    c.set("route", " Direct ").unwrap();
    assert_eq!(c.route, crate::direct::RouteSetting::Direct);
    assert!(c.set("route", "sideways").is_err());
}

#[test]
fn bad_names_and_values_say_which_setting() {
    let mut c = Config::default();
    let e = c.set("radixx", "2").unwrap_err();
    assert!(matches!(e, ConfigError::Unknown { .. }));
    assert!(e.to_string().contains("radixx"));
    let e = c.set("TBON_RADIX", "sixty").unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::BadValue {
                setting: "radix",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("TBON_RADIX"), "{e}");
    assert!(c.set("ipv4", "maybe").is_err());
    assert!(c.set("port", "70000").is_err());
    assert_eq!(c, Config::default(), "failed sets change nothing");
}

#[test]
fn radix_clamps() {
    let mut c = Config::default();
    c.set("radix", "1").unwrap();
    assert_eq!(c.effective_radix(), 2);
    c.validate().unwrap();
    c.set("radix", "3").unwrap();
    assert_eq!(c.effective_radix(), 3);
}

fn invalid(changes: &[(&str, &str)]) -> &'static str {
    let mut c = Config::default();
    for (n, v) in changes {
        c.set(n, v).unwrap();
    }
    match c.validate() {
        Err(ConfigError::Invalid { setting, .. }) | Err(ConfigError::BadValue { setting, .. }) => {
            setting
        }
        other => panic!("{changes:?}: expected an error, got {other:?}"),
    }
}

#[test]
fn validate_catches_each_problem() {
    assert_eq!(invalid(&[("port_range", "5-4")]), "port_range");
    assert_eq!(invalid(&[("port_range", "0-4")]), "port_range");
    assert_eq!(invalid(&[("port_range", "4")]), "port_range");
    assert_eq!(invalid(&[("port_range", "a-b")]), "port_range");
    assert_eq!(invalid(&[("port_range", "1-99999")]), "port_range");
    assert_eq!(
        invalid(&[("port_range", "5-6"), ("port", "80")]),
        "port_range"
    );
    // A peer's address is matched: an interface name cannot be.
    assert_eq!(invalid(&[("bulk_networks", "eth1")]), "bulk_networks");
    assert_eq!(
        invalid(&[("bulk_networks", "10.0.0.0/99")]),
        "bulk_networks"
    );
    assert_eq!(invalid(&[("msg_max_bytes", "0")]), "msg_max_bytes");
    assert_eq!(invalid(&[("msg_max_bytes", "4294967296")]), "msg_max_bytes");
    assert_eq!(
        invalid(&[("send_queue_max_bytes", "1000")]),
        "send_queue_max_bytes"
    );
    assert_eq!(
        invalid(&[("if_include", "lo"), ("if_exclude", "eth0")]),
        "if_include"
    );
    assert_eq!(invalid(&[("if_exclude", "10.0.0.0/40")]), "if_exclude");
    assert_eq!(invalid(&[("ipv4", "0")]), "ipv4");
    assert_eq!(invalid(&[("dvm_id", "a;b")]), "dvm_id");
    assert_eq!(invalid(&[("dvm_id", "")]), "dvm_id");
    assert_eq!(invalid(&[("unmatched_max", "0")]), "unmatched_max");
    assert_eq!(
        invalid(&[("handshake_timeout_ms", "0")]),
        "handshake_timeout_ms"
    );
    assert_eq!(invalid(&[("wireup_timeout_ms", "0")]), "wireup_timeout_ms");
    assert_eq!(
        invalid(&[("reconnect_base_ms", "5000")]),
        "reconnect_base_ms"
    );
    assert_eq!(invalid(&[("keepalive_count", "0")]), "keepalive_count");
    assert_eq!(
        invalid(&[("keepalive_idle_s", "40000")]),
        "keepalive_idle_s"
    );
    assert_eq!(
        invalid(&[("heartbeat_timeout_ms", "1000")]),
        "heartbeat_timeout_ms"
    );
    for relm in [
        "relm_cache_ms",
        "relm_cache_max",
        "relm_retransmit_ms",
        "relm_gate_ms",
        "relm_unacked_max",
        "relm_pending_max",
    ] {
        assert_eq!(invalid(&[(relm, "0")]), relm);
        assert_eq!(invalid(&[(relm, "3600001")]), relm);
    }
    assert_eq!(
        invalid(&[("relm_unacked_max", "1048577")]),
        "relm_unacked_max"
    );
    // And a valid non-default combination passes.
    let mut c = Config::default();
    c.set("port_range", "20000-20100").unwrap();
    c.set("if_include", "lo,10.0.0.0/8").unwrap();
    c.validate().unwrap();
    assert_eq!(c.port_range_bounds().unwrap(), Some((20000, 20100)));
}

#[test]
fn from_lookup_applies_env_overrides() {
    let env: HashMap<&str, &str> = [
        ("TBON_RADIX", "8"),
        ("TBON_IPV6", "true"),
        ("TBON_PORT_RANGE", ""),
        ("UNRELATED", "x"),
    ]
    .into_iter()
    .collect();
    let c = Config::from_lookup(|k| env.get(k).map(OsString::from)).unwrap();
    assert_eq!(c.radix, 8);
    assert!(c.ipv6);
    assert_eq!(c.port_range, None);

    let e =
        Config::from_lookup(|k| (k == "TBON_PORT").then(|| OsString::from("http"))).unwrap_err();
    assert!(matches!(
        e,
        ConfigError::BadValue {
            setting: "port",
            ..
        }
    ));
    let e = Config::from_lookup(|k| (k == "TBON_IPV4").then(|| OsString::from("no"))).unwrap_err();
    assert!(
        matches!(
            e,
            ConfigError::Invalid {
                setting: "ipv4",
                ..
            }
        ),
        "from_lookup validates"
    );
}

/// `from_lookup` (and so `from_env`) takes the job key itself from `TBON_KEY` only when no key
/// file is named; a badly sized key names the variable; `Config::default` reads nothing.
#[test]
fn the_key_comes_from_tbon_key_only_without_a_key_file() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(*v))
        }
    };
    let key = "0123456789abcdef0123";
    let c = Config::from_lookup(vars(&[("TBON_KEY", "0123456789abcdef0123\n")])).unwrap();
    assert_eq!(
        c.key.as_ref().map(|k| k.as_bytes().to_vec()),
        Some(key.as_bytes().to_vec())
    );
    let c = Config::from_lookup(vars(&[
        ("TBON_KEY", "0123456789abcdef0123"),
        ("TBON_KEY_FILE", "/etc/tbon/job.key"),
    ]))
    .unwrap();
    assert!(c.key.is_none());
    assert_eq!(c.key_file.as_deref(), Some("/etc/tbon/job.key"));
    let e = Config::from_lookup(vars(&[("TBON_KEY", "short")])).unwrap_err();
    assert!(matches!(e, ConfigError::Key(_)), "{e}");
    assert!(e.to_string().contains("TBON_KEY"), "{e}");
    assert!(Config::default().key.is_none());
}
