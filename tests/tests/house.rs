//! The house rules, checked on the workspace's own source: no source file of the node over 600
//! lines and no function of it over 100 (its test modules aside), no two files of the
//! workspace that import each other, and a notice walk in `docs/architecture.md` that names
//! only functions the node has.
//!
//! The source is read as rustfmt leaves it (the CI checks formatting first): a function ends
//! at the first `}` at its own indentation, and a file's tests start at its top-level
//! `#[cfg(test)]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Crates whose files must not import each other.
const CRATES: [&str; 9] = [
    "api",
    "pool",
    "outer",
    "strategies",
    "model",
    "consensus",
    "node",
    "testnet",
    "tests",
];

/// Longest source file of the node, tests aside.
const MAX_FILE_LINES: usize = 600;
/// Longest function of the node, signature to closing brace.
const MAX_FN_LINES: usize = 100;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_path_buf()
}

/// The library sources of `krate` (binaries under `src/bin` and `main.rs` are crates of their
/// own).
fn sources(krate: &str) -> Vec<PathBuf> {
    sources_in(&workspace().join(krate).join("src"))
}

/// The library sources under the `src` folder `src`.
fn sources_in(src: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "bin") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "main.rs")
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(src, &mut out);
    out.sort();
    out
}

/// A file's text up to its top-level test module.
fn without_tests(text: &str) -> String {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shown(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The name of the function a line starts, if it starts one.
fn starts_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// The functions of `text` with a body, and their lengths in lines.
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = starts_fn(line) else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let Some(open) = (i..lines.len()).find(|&j| {
            let t = lines[j].trim_end();
            t.ends_with('{') || t.ends_with(';') || t.ends_with('}')
        }) else {
            continue;
        };
        let opened = lines[open].trim_end();
        if opened.ends_with(';') {
            continue;
        }
        if opened.ends_with('}') {
            out.push((name.to_string(), open - i + 1));
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j] == close) {
            out.push((name.to_string(), end - i + 1));
        }
    }
    out
}

#[test]
fn no_source_file_of_the_node_is_over_600_lines() {
    let long: Vec<String> = sources("node")
        .iter()
        .map(|p| (p, without_tests(&read(p)).lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(p, n)| format!("{} ({n} lines)", shown(p)))
        .collect();
    assert!(long.is_empty(), "over {MAX_FILE_LINES} lines: {long:?}");
}

#[test]
fn no_function_of_the_node_is_over_100_lines() {
    let long: Vec<String> = sources("node")
        .iter()
        .flat_map(|p| {
            functions(&without_tests(&read(p)))
                .into_iter()
                .filter(|(_, n)| *n > MAX_FN_LINES)
                .map(move |(name, n)| format!("{}: {name} ({n} lines)", shown(p)))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_FN_LINES} lines: {long:?}");
}

#[test]
fn the_measures_see_what_they_measure() {
    let text = "fn a() {\n    x;\n}\n\npub(crate) async fn b(\n    y: u8,\n) -> u8 {\n    y\n}\n\
                fn c() -> u8 { 3 }\ntrait T {\n    fn d(&self)\n    -> u8;\n}\n\
                #[cfg(test)]\nmod tests {}\n";
    assert_eq!(
        functions(text),
        vec![("a".into(), 3), ("b".into(), 5), ("c".into(), 1)]
    );
    assert_eq!(without_tests(text).lines().count(), 14);
    let paths = paths_in("use crate::a::{b, c::{d, e as f}};\nlet x = super::g::h(1);\n");
    assert_eq!(
        paths,
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "super::g::h"
        ]
    );
}

/// Expands `a::{b, c::{d, e as f}}` into `a::b`, `a::c::d`, `a::c::e` (aliases dropped).
fn expand(path: &str) -> Vec<String> {
    let path = path.trim();
    let Some(open) = path.find('{') else {
        let plain = path.split(" as ").next().unwrap_or(path);
        return vec![plain.split_whitespace().collect()];
    };
    let mut depth = 0;
    let mut close = path.len();
    for (i, c) in path.char_indices().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = i;
                    break;
                }
            }
            _ => {}
        }
    }
    let prefix: String = path[..open].split_whitespace().collect();
    let mut parts = Vec::new();
    let (mut depth, mut current) = (0, String::new());
    for c in path[open + 1..close].chars() {
        match c {
            ',' if depth == 0 => parts.push(std::mem::take(&mut current)),
            '{' | '}' => {
                depth += if c == '{' { 1 } else { -1 };
                current.push(c);
            }
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
        .iter()
        .map(|p| p.trim())
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// Every path of a file's code (not its comments): those of its `use` declarations, expanded,
/// then the `a::b` paths written inline.
fn paths_in(text: &str) -> Vec<String> {
    let mut code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("use ").map(|i| from + i) {
        let at_word = !code[..i].ends_with(is_ident);
        let end = code[i..].find(';').map_or(code.len(), |e| i + e);
        if at_word {
            out.extend(expand(&code[i + 4..end]));
            // Blanked, so that the inline scan below does not see the declaration again.
            code.replace_range(i..end, &" ".repeat(end - i));
        }
        from = end.min(code.len());
    }
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts =
            is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let (mut j, mut segments) = (i, 0);
        loop {
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            segments += 1;
            let more = j + 2 < chars.len()
                && chars[j] == ':'
                && chars[j + 1] == ':'
                && is_ident(chars[j + 2]);
            if !more {
                break;
            }
            j += 2;
        }
        if segments > 1 {
            out.push(chars[i..j].iter().collect());
        }
        i = j;
    }
    out
}

/// A crate's module tree: the file of each module path.
struct Crate {
    src: PathBuf,
}

impl Crate {
    fn file(&self, module: &[String]) -> Option<PathBuf> {
        if module.is_empty() {
            return Some(self.src.join("lib.rs")).filter(|p| p.exists());
        }
        let base = module.iter().fold(self.src.clone(), |p, m| p.join(m));
        let flat = base.with_extension("rs");
        let nested = base.join("mod.rs");
        [flat, nested].into_iter().find(|p| p.exists())
    }

    fn module_of(&self, file: &Path) -> Vec<String> {
        let rel = file.strip_prefix(&self.src).expect("a file of the crate");
        let mut parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
            parts.pop();
        }
        parts
    }

    /// The names `module`'s file re-exports (`pub use`), with the paths they come from.
    fn reexports(&self, module: &[String]) -> BTreeMap<String, Vec<String>> {
        let Some(file) = self.file(module) else {
            return BTreeMap::new();
        };
        let text = without_tests(&read(&file));
        let mut out = BTreeMap::new();
        for line in text.split(';') {
            let Some(i) = line
                .find("pub use ")
                .or_else(|| line.find("pub(crate) use "))
            else {
                continue;
            };
            let decl = &line[i..];
            let path = &decl[decl.find("use ").expect("a use") + 4..];
            for full in expand(path) {
                let segments: Vec<String> = full.split("::").map(str::to_string).collect();
                if let Some(name) = segments.last() {
                    out.insert(name.clone(), segments.clone());
                }
            }
        }
        out
    }

    /// The file `path` (written in the module `here`) names an item or module of.
    fn resolve(&self, here: &[String], path: &[String], depth: usize) -> Option<PathBuf> {
        let (mut module, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (here.to_vec(), &path[1..]),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let up = here.len().checked_sub(supers)?;
                (here[..up].to_vec(), &path[supers..])
            }
            first => {
                let mut child = here.to_vec();
                child.push(first.to_string());
                self.file(&child)?;
                (here.to_vec(), path)
            }
        };
        for segment in rest {
            if segment == "*" || segment == "self" {
                break;
            }
            let mut child = module.clone();
            child.push(segment.clone());
            if self.file(&child).is_some() {
                module = child;
                continue;
            }
            if depth < 5
                && let Some(source) = self.reexports(&module).get(segment)
            {
                return self.resolve(&module, source, depth + 1);
            }
            break;
        }
        self.file(&module)
    }
}

/// The pairs of files of the crate at `src` that import each other.
fn mutual_imports(src: &Path) -> BTreeSet<String> {
    let c = Crate {
        src: src.to_path_buf(),
    };
    let mut imports: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in sources_in(src) {
        let here = c.module_of(&file);
        let text = without_tests(&read(&file));
        let targets = paths_in(&text)
            .iter()
            .filter_map(|p| {
                let segments: Vec<String> = p.split("::").map(str::to_string).collect();
                c.resolve(&here, &segments, 0)
            })
            .filter(|t| *t != file)
            .collect();
        imports.insert(file, targets);
    }
    let mut mutual = BTreeSet::new();
    for (a, targets) in &imports {
        for b in targets {
            if imports.get(b).is_some_and(|t| t.contains(a)) {
                let pair = if a < b { (a, b) } else { (b, a) };
                mutual.insert(format!("{} <-> {}", shown(pair.0), shown(pair.1)));
            }
        }
    }
    mutual
}

#[test]
fn no_two_files_of_the_workspace_import_each_other() {
    let mutual: BTreeSet<String> = CRATES
        .iter()
        .flat_map(|krate| mutual_imports(&workspace().join(krate).join("src")))
        .collect();
    assert!(
        mutual.is_empty(),
        "files that import each other: {mutual:?}"
    );
}

#[test]
fn mutual_imports_are_found_through_re_exports_and_children() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("room")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod room;\npub use b::B;\n");
    write("a.rs", "use crate::B;\npub struct A;\n");
    write("b.rs", "pub struct B(crate::a::A);\n");
    write(
        "room/mod.rs",
        "mod door;\npub struct Key;\npub use door::Door;\n",
    );
    write("room/door.rs", "use super::Key;\npub struct Door(Key);\n");
    let mutual = mutual_imports(&src);
    assert_eq!(mutual.len(), 2, "{mutual:?}");
    assert!(
        mutual
            .iter()
            .any(|m| m.contains("src/a.rs") && m.contains("src/b.rs")),
        "{mutual:?}"
    );
    assert!(
        mutual
            .iter()
            .any(|m| m.contains("room/door.rs") && m.contains("room/mod.rs"))
    );
    write(
        "room/mod.rs",
        "mod door;\nmod key;\npub use door::Door;\npub use key::Key;\n",
    );
    write("room/key.rs", "pub struct Key;\n");
    write(
        "room/door.rs",
        "use super::key::Key;\npub struct Door(Key);\n",
    );
    assert_eq!(mutual_imports(&src).len(), 1, "the room's cycle is gone");
}

/// The backticked names of the notice walk in `docs/architecture.md`: from its heading to the
/// next paragraph that is not part of it.
fn walk_names() -> Vec<String> {
    let doc = read(&workspace().join("docs").join("architecture.md"));
    let start = doc
        .find("**The walk of a preemption notice**")
        .expect("the architecture document walks a notice");
    let walk = &doc[start..];
    let end = walk
        .match_indices("\n\n")
        .map(|(i, _)| i)
        .find(|&i| {
            let next = walk[i + 2..].trim_start();
            !(next.starts_with(|c: char| c.is_ascii_digit()) || next.starts_with("   "))
        })
        .unwrap_or(walk.len());
    walk[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| name.contains("::") && !name.contains(' '))
        .map(|name| name.trim_end_matches("()").to_string())
        .collect()
}

/// Whether `line` declares the type `owner` or an `impl` block of it.
fn declares(line: &str, owner: &str) -> bool {
    let line = line.trim_start();
    let words = |l: &str| {
        l.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == owner)
    };
    (line.starts_with("impl") && words(line))
        || [
            "pub struct ",
            "pub enum ",
            "pub trait ",
            "struct ",
            "enum ",
            "trait ",
        ]
        .iter()
        .any(|kind| {
            line.strip_prefix(kind)
                .is_some_and(|rest| words(rest.split(['<', ' ', ':', '{']).next().unwrap_or("")))
        })
}

#[test]
fn the_notice_walk_names_functions_the_node_has() {
    let names = walk_names();
    assert!(names.len() >= 10, "the walk names its hops: {names:?}");
    let files: Vec<(PathBuf, String)> = sources("node")
        .into_iter()
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| {
            let (owner, item) = name.rsplit_once("::").expect("a qualified name");
            let owner = owner.rsplit("::").next().unwrap_or(owner);
            let is_fn = item.starts_with(|c: char| c.is_lowercase());
            !files.iter().any(|(path, text)| {
                let in_owner = path.file_stem().is_some_and(|s| s == owner)
                    || text.lines().any(|l| declares(l, owner));
                let defined = if is_fn {
                    text.lines().any(|l| starts_fn(l) == Some(item))
                } else {
                    text.contains(&format!("    {item}")) || text.contains(&format!(" {item}("))
                };
                in_owner && defined
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the walk names what the node does not have: {missing:?}"
    );
}
