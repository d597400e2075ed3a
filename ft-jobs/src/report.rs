//! Reading a job's output: the JSON lines of its surviving ranks, and the checks every
//! backend's tests make on them. Each check returns what is wrong, naming the rank.

use std::collections::BTreeSet;

use serde_json::Value;

/// The JSON lines of `stdout` (other lines are skipped), sorted by rank.
pub fn parse_lines(stdout: &str) -> Result<Vec<Value>, String> {
    let mut lines = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("bad line {l:?}: {e}")))
        .collect::<Result<Vec<Value>, String>>()?;
    lines.sort_by_key(|v| v["rank"].as_u64());
    Ok(lines)
}

/// The ranks that printed a line, in order.
pub fn ranks(lines: &[Value]) -> Vec<u64> {
    lines.iter().filter_map(|v| v["rank"].as_u64()).collect()
}

/// A JSON array of ranks (a `G` or an `L`) as a set; `None` if it is not one.
pub fn rank_set(value: &Value) -> Option<BTreeSet<u64>> {
    value.as_array()?.iter().map(Value::as_u64).collect()
}

/// The agreed set `G` of every validation, checked identical (epochs and sets) at every
/// rank of a validation job.
pub fn agreed(lines: &[Value]) -> Result<Vec<Value>, String> {
    let first = lines
        .first()
        .and_then(|l| l["validations"].as_array())
        .ok_or("no line with validations")?;
    if let Some(other) = lines
        .iter()
        .find(|l| l["validations"].as_array() != Some(first))
    {
        return Err(format!(
            "ranks disagree: {} against rank {}'s {first:?}",
            other, lines[0]["rank"]
        ));
    }
    Ok(first.iter().map(|v| v["G"].clone()).collect())
}

/// Every destination of a broadcast job received exactly the outputs it needs, byte
/// for byte, and no rank gave the broadcast up.
pub fn served(lines: &[Value]) -> Result<(), String> {
    for line in lines {
        let rank = &line["rank"];
        if line["received"] != line["needs"] {
            return Err(format!(
                "rank {rank} received {} but needs {}",
                line["received"], line["needs"]
            ));
        }
        if line["verified"] != true {
            return Err(format!("rank {rank}'s outputs differ from the root's"));
        }
        if line["abandoned"] != false {
            return Err(format!("rank {rank} abandoned the broadcast"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_are_sorted_by_rank_and_noise_is_skipped() {
        let out = "{\"rank\":2}\nsome warning\n{\"rank\":0}\n";
        let lines = parse_lines(out).unwrap();
        assert_eq!(ranks(&lines), [0, 2]);
        assert!(parse_lines("{\"rank\":").is_err());
    }

    #[test]
    fn agreement_and_service_are_checked() {
        let v = |g: Value| json!({"rank": 0, "validations": [{"epoch": 1, "G": g}]});
        assert_eq!(
            agreed(&[v(json!([2])), v(json!([2]))]).unwrap(),
            [json!([2])]
        );
        assert!(agreed(&[v(json!([2])), v(json!([]))]).is_err());
        assert!(agreed(&[]).is_err());
        assert_eq!(rank_set(&json!([5, 4, 5])), Some(BTreeSet::from([4, 5])));
        assert_eq!(rank_set(&json!([4, "x"])), None);

        let b = |received: Value, verified: bool| {
            json!({"rank": 1, "needs": ["A"], "received": received,
                   "verified": verified, "abandoned": false})
        };
        assert!(served(&[b(json!(["A"]), true)]).is_ok());
        assert!(served(&[b(json!([]), true)]).is_err());
        assert!(served(&[b(json!(["A"]), false)]).is_err());
    }
}
