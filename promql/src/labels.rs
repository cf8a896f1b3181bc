//! Label sets: sorted (name, value) pairs, `__name__` among them, no empty values.

use std::fmt;
use std::sync::Arc;

/// The metric name label.
pub const NAME: &str = "__name__";

/// A series' label set, sorted by name, without empty values. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Labels(Arc<Vec<(String, String)>>);

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{k}={v:?}")?;
        }
        write!(f, "}}")
    }
}

impl Labels {
    /// A label set from pairs in any order; empty values are dropped, of a repeated name the
    /// last value is kept.
    pub fn new(mut pairs: Vec<(String, String)>) -> Self {
        pairs.retain(|(_, v)| !v.is_empty());
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, String)> = Vec::with_capacity(pairs.len());
        for p in pairs {
            match out.last_mut() {
                Some(last) if last.0 == p.0 => *last = p,
                _ => out.push(p),
            }
        }
        Self(Arc::new(out))
    }

    /// The pairs, sorted by name.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    /// The value of `name`, `""` when absent.
    pub fn get(&self, name: &str) -> &str {
        match self.0.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
            Ok(i) => &self.0[i].1,
            Err(_) => "",
        }
    }

    /// True when the set has `name`.
    pub fn has(&self, name: &str) -> bool {
        !self.get(name).is_empty()
    }

    /// The set without `__name__`.
    pub fn without_name(&self) -> Labels {
        if !self.has(NAME) {
            return self.clone();
        }
        Labels(Arc::new(
            self.0.iter().filter(|(k, _)| k != NAME).cloned().collect(),
        ))
    }

    /// Only the labels named in `names`.
    pub fn keep(&self, names: &[String]) -> Labels {
        Labels(Arc::new(
            self.0
                .iter()
                .filter(|(k, _)| names.iter().any(|n| n == k))
                .cloned()
                .collect(),
        ))
    }

    /// Without the labels named in `names`.
    pub fn drop(&self, names: &[String]) -> Labels {
        Labels(Arc::new(
            self.0
                .iter()
                .filter(|(k, _)| !names.iter().any(|n| n == k))
                .cloned()
                .collect(),
        ))
    }

    /// With `name` set to `value` (removed when `value` is empty).
    pub fn with(&self, name: &str, value: &str) -> Labels {
        let mut pairs: Vec<(String, String)> =
            self.0.iter().filter(|(k, _)| k != name).cloned().collect();
        if !value.is_empty() {
            pairs.push((name.to_string(), value.to_string()));
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Labels(Arc::new(pairs))
    }

    /// The number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
