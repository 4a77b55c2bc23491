//! Cargo started from inside a process that cargo started (a test, `cargo run`'s binary).

use std::process::Command;

/// The variables cargo sets for a process it starts, by prefix. ring's build script declares
/// `rerun-if-env-changed` on the package ones, so a cargo that inherited them would rebuild
/// ring and everything above it (snow, libp2p, the node), and the next cargo without them
/// would rebuild it all back: twice ~25 s on two cores for each test binary that builds.
const SET_BY_CARGO: [&str; 8] = [
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

/// The cargo that started this process (`CARGO`, else `cargo` on the path), without the
/// package variables it set for this process.
pub fn command() -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        let set_by_cargo = name
            .to_str()
            .is_some_and(|n| SET_BY_CARGO.iter().any(|p| n.starts_with(p)));
        if set_by_cargo {
            cmd.env_remove(&name);
        }
    }
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_variables_of_this_test_are_not_passed_on() {
        assert!(
            std::env::var_os("CARGO_PKG_NAME").is_some(),
            "cargo sets it for tests"
        );
        let removed: Vec<String> = command()
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(name, _)| name.to_string_lossy().into_owned())
            .collect();
        assert!(removed.iter().any(|n| n == "CARGO_PKG_NAME"), "{removed:?}");
        assert!(
            removed.iter().any(|n| n == "CARGO_MANIFEST_DIR"),
            "{removed:?}"
        );
        assert!(removed.iter().all(|n| n != "CARGO_HOME" && n != "PATH"));
    }
}
