//! `marin3r completion`: the script a shell loads, loaded by that shell.

use std::process::Command;

/// bash sources the script, and its completion function offers the subcommands and a
/// subcommand's flags for what is typed.
#[test]
fn bash_loads_the_completion_and_completes_commands_and_flags() {
    let marin3r = env!("CARGO_BIN_EXE_marin3r");
    // COMP_WORDS/COMP_CWORD as bash sets them for `marin3r pro<TAB>` and `marin3r check --<TAB>`.
    let script = format!(
        r#"source <("{marin3r}" completion bash) || exit 3
complete -p marin3r || exit 4
COMP_WORDS=(marin3r pro); COMP_CWORD=1; COMP_LINE="marin3r pro"; COMP_POINT=${{#COMP_LINE}}
_marin3r marin3r pro marin3r
echo "words: ${{COMPREPLY[*]}}"
COMP_WORDS=(marin3r check --); COMP_CWORD=2; COMP_LINE="marin3r check --"; COMP_POINT=${{#COMP_LINE}}
_marin3r marin3r -- check
echo "flags: ${{COMPREPLY[*]}}"
"#
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &script])
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let registered = stdout.lines().find(|l| l.starts_with("complete "));
    assert!(
        registered.is_some_and(|l| l.ends_with(" -F _marin3r marin3r")),
        "{stdout}"
    );
    let words = stdout.lines().find_map(|l| l.strip_prefix("words: "));
    assert_eq!(words, Some("proxy-config proxy-status"), "{stdout}");
    let flags = stdout.lines().find_map(|l| l.strip_prefix("flags: "));
    assert!(
        flags.is_some_and(|f| f.split(' ').any(|w| w == "--kubeconfig")),
        "{stdout}"
    );
}

#[test]
fn every_shell_gets_a_script_and_an_unknown_one_is_refused() {
    let marin3r = env!("CARGO_BIN_EXE_marin3r");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(marin3r)
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("proxy-status"), "{shell}: {script}");
    }
    let out = Command::new(marin3r)
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tcsh") && stderr.contains("bash"),
        "{stderr}"
    );
}
