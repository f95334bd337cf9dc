//! The daemon's settings as command-line flags: one `--name` per [`Config::settings`] entry,
//! read from its `TBON_<NAME>` variable when the flag is absent. The library describes its
//! settings and parses their text ([`Config::set`]); only this file knows clap.

use clap::builder::{BoolishValueParser, ValueParser};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use tbon::config::{Config, SettingKind};

/// Every setting as a flag; flattened into `tbon daemon`. Precedence: the flag, then the
/// environment variable, then [`Config::default`].
#[derive(Debug, Clone)]
pub struct SettingFlags(pub Config);

/// The flag's spelling and clap's argument id: `port_range` is `--port-range`.
fn long(name: &str) -> String {
    name.replace('_', "-")
}

/// The first paragraph of a doc comment on one line, for `--help`; the whole for `--help`'s
/// long form.
fn short_help(doc: &str) -> String {
    doc.split("\n\n")
        .next()
        .unwrap_or(doc)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

impl Args for SettingFlags {
    fn augment_args(mut cmd: Command) -> Command {
        let defaults = Config::default();
        for s in Config::settings() {
            let mut arg = Arg::new(s.name)
                .long(long(s.name))
                .value_name(s.name.to_ascii_uppercase())
                .env(s.env)
                .help(short_help(s.doc));
            let default = defaults.get(s.name).unwrap_or_default();
            arg = match s.kind {
                SettingKind::Bool => arg
                    .action(ArgAction::Set)
                    .value_parser(ValueParser::new(BoolishValueParser::new()))
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true"),
                SettingKind::List => arg.action(ArgAction::Append).value_delimiter(','),
                _ => arg.action(ArgAction::Set),
            };
            if !default.is_empty() {
                arg = arg.default_value(default);
            }
            if s.name == "rejoin" {
                // A rank of a grown DVM (beyond `initial_size`) joins the way a restarted
                // daemon rejoins: the same admission by rank 0.
                arg = arg.visible_alias("join");
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for SettingFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut config = Config::default();
        apply(m, &mut config)?;
        Ok(SettingFlags(config))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        apply(m, &mut self.0)
    }
}

/// Sets every setting given by flag or environment (not the defaults clap shows) through
/// [`Config::set`], so a flag and the library parse a value the same way.
fn apply(m: &ArgMatches, config: &mut Config) -> Result<(), clap::Error> {
    for s in Config::settings() {
        if matches!(
            m.value_source(s.name),
            None | Some(ValueSource::DefaultValue)
        ) {
            continue;
        }
        let text = match s.kind {
            SettingKind::Bool => m
                .get_one::<bool>(s.name)
                .map(|b| b.to_string())
                .unwrap_or_default(),
            _ => m
                .get_many::<String>(s.name)
                .map(|v| v.cloned().collect::<Vec<_>>().join(","))
                .unwrap_or_default(),
        };
        config.set(s.name, &text).map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: SettingFlags,
    }

    /// The flags with environment lookups switched off, so the test does not depend on the
    /// caller's environment.
    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        let cmd = Cli::command().mut_args(|a| a.env(None::<&'static str>));
        let m = cmd.try_get_matches_from(std::iter::once("tbon").chain(args.iter().copied()))?;
        Ok(SettingFlags::from_arg_matches(&m)?.0)
    }

    /// A value for each setting that differs from its default, as text.
    fn non_default_value(name: &str) -> &'static str {
        match name {
            "dvm_id" => "other.dvm",
            "ipv4" | "link_resend" | "bulk_connection" => "false",
            "insecure" | "ipv6" | "rejoin" => "true",
            "key_file" => "/etc/tbon/job.key",
            "port_range" => "20000-20100",
            "if_include" => "lo,10.0.0.0/8",
            "if_exclude" => "eth9",
            "bulk_networks" => "10.78.0.0/16",
            "route" => "auto",
            "contacts" => "full",
            _ => "7",
        }
    }

    #[test]
    fn no_flags_is_the_default() {
        assert_eq!(parse(&[]).unwrap(), Config::default());
    }

    #[test]
    fn every_setting_is_a_flag_with_its_variable_and_help() {
        let cmd = SettingFlags::augment_args(Command::new("t"));
        let args: Vec<_> = cmd.get_arguments().collect();
        assert_eq!(args.len(), Config::names().len());
        for (arg, s) in args.iter().zip(Config::settings()) {
            assert_eq!(arg.get_long(), Some(long(s.name).as_str()));
            assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(s.env));
            assert!(arg.get_help().is_some(), "{} has no help", s.name);
        }
    }

    #[test]
    fn a_flag_sets_what_set_sets() {
        for &name in Config::names() {
            let value = non_default_value(name);
            let mut by_set = Config::default();
            by_set.set(name, value).unwrap();
            let flag = format!("--{}={value}", long(name));
            assert_eq!(parse(&[&flag]).unwrap(), by_set, "{flag}");
        }
        // A bare boolean flag means true; a list may be repeated.
        assert!(parse(&["--ipv6"]).unwrap().ipv6);
        assert!(!parse(&["--ipv4=false", "--ipv6"]).unwrap().ipv4);
        let c = parse(&["--if-include", "lo", "--if-include", "10.0.0.0/8"]).unwrap();
        assert_eq!(c.if_include, ["lo", "10.0.0.0/8"]);
    }

    #[test]
    fn a_bad_value_names_its_setting() {
        let e = parse(&["--radix", "many"]).unwrap_err().to_string();
        assert!(e.contains("radix"), "{e}");
    }
}
