import json
import subprocess
from pathlib import Path


def run(*args):
    return subprocess.run(["python3", "/app/csv2json.py", *map(str, args)], capture_output=True,
                          text=True, timeout=30)


def convert_file(tmp_path, text, *extra):
    src = tmp_path / "in.csv"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "out.json"
    r = run(src, out, *extra)
    return r, out


def test_example_inventory(tmp_path):
    out = tmp_path / "inv.json"
    r = run("/app/inventory.csv", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data == [
        {"sku": "A-100", "name": "Widget", "qty": 12, "price": 2.5, "active": True, "notes": None},
        {"sku": "B-200", "name": "Gadget, large", "qty": 0, "price": 19.99, "active": False,
         "notes": "discontinued"},
        {"sku": "C-300", "name": "Doohickey", "qty": -3, "price": 1000.0, "active": True,
         "notes": 'says "hi"'},
        {"sku": "D-400", "name": "007 Agent", "qty": "0042", "price": 0.5, "active": "yes", "notes": None},
    ]


def test_types_are_exact(tmp_path):
    r, out = convert_file(tmp_path, "a,b,c,d,e,f\n7,7.0,nan,inf,TRUE, 5\n")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(out.read_text())
    assert row["a"] == 7 and type(row["a"]) is int
    assert row["b"] == 7.0 and type(row["b"]) is float
    assert row["c"] == "nan" and row["d"] == "inf"
    assert row["e"] is True
    assert row["f"] == " 5"


def test_key_order_and_multiline(tmp_path):
    r, out = convert_file(tmp_path, 'z,a,m\n1,"line one\nline two",x\n')
    assert r.returncode == 0
    text = out.read_text()
    (row,) = json.loads(text)
    assert list(row) == ["z", "a", "m"]
    assert row["a"] == "line one\nline two"
    assert "\n  " in text  # indented output


def test_key_option(tmp_path):
    r, out = convert_file(tmp_path, "id,name\n10,x\n010,y\n", "--key", "id")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == {"10": {"id": 10, "name": "x"}, "010": {"id": "010", "name": "y"}}


def test_key_errors(tmp_path):
    r, out = convert_file(tmp_path, "id,name\n1,x\n1,y\n", "--key", "id")
    assert r.returncode == 1 and r.stderr.strip() and not out.exists()
    r, out = convert_file(tmp_path, "id,name\n1,x\n", "--key", "nope")
    assert r.returncode == 1 and not out.exists()


def test_missing_input(tmp_path):
    r = run(tmp_path / "missing.csv", tmp_path / "o.json")
    assert r.returncode == 1 and r.stderr.strip()
