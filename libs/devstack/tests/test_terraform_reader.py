"""The HCL reader's evaluation (aegis_devstack.testing.terraform) against Terraform's documented
semantics: the comparison of deploy/terraform with the template is only as right as this."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from aegis_devstack.testing.terraform import Scope, Unsupported, load_module

LOCALS = """
locals {
  tasks = {
    seal  = { family = "aegis-seal", command = ["aegis", "seal", "raw"] }
    other = { family = "x", command = [] }
  }
  names    = [for name, task in local.tasks : name]
  families = [for task in local.tasks : task.family]
  indexed  = { for i, word in ["a", "b"] : word => i }
  kept     = { for name, task in local.tasks : name => join(" ", task.command) if length(task.command) != 0 }
  first    = local.tasks["seal"].command[1]
  escaped  = "one\\n\\"two\\""
}
"""


def evaluate(source: str, name: str) -> Any:
    """The local ``name`` of ``source``, the locals before it evaluated first, in order."""
    module = load_module(Path(), text={"main.tf": source})
    known: dict[str, Any] = {}
    scope = Scope({"local": known})
    for local, raw in module["locals"].items():
        known[local] = scope.value(raw)
        if local == name:
            return known[local]
    raise KeyError(name)


def test_a_for_expression_over_an_object_binds_its_values_or_its_keys_and_values():
    assert evaluate(LOCALS, "names") == ["other", "seal"]  # an object's keys, in lexical order
    assert evaluate(LOCALS, "families") == ["x", "aegis-seal"]
    assert evaluate(LOCALS, "indexed") == {"a": 0, "b": 1}  # over a list: index and element


def test_an_object_for_expression_keeps_the_elements_its_condition_holds_for():
    assert evaluate(LOCALS, "kept") == {"seal": "aegis seal raw"}


def test_references_index_objects_by_key_and_lists_by_position():
    assert evaluate(LOCALS, "first") == "seal"


def test_a_template_reads_its_escapes():
    assert evaluate(LOCALS, "escaped") == 'one\n"two"'


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ('slice(split(" ", "30 2 * * *"), 0, 2)', ["30", "2"]),
        (
            'trimsuffix(trimprefix(basename("arn:aws:iam::1:role/aegis-x-task"), "aegis-"), "-task")',
            "x",
        ),
        ("merge({ a = 1 }, { a = 2, b = 3 })", {"a": 2, "b": 3}),
        ('toset(["b", "a", "b"])', ["a", "b"]),
        ('one([for x in ["a", "b"] : x if x == "b"])', "b"),
        ("one([])", None),
        (
            'yamldecode("kind: CronJob\\nspec:\\n  schedule: \\"30 2 * * *\\"")',
            {"kind": "CronJob", "spec": {"schedule": "30 2 * * *"}},
        ),
    ],
)
def test_the_functions_answer_as_terraforms(expression: str, value: Any):
    assert evaluate(f"locals {{\n  v = {expression}\n}}\n", "v") == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ('regex("a", "a")', Unsupported),  # a function the reader does not know
        ('replace("a", "/a/", "b")', Unsupported),  # replace with a regular expression
        ('{ for x in ["a"] : x => x... }', Unsupported),  # grouping
        ('{ for x in ["a", "a"] : x => x }', ValueError),  # a key twice: Terraform refuses it
        ('one(["a", "b"])', ValueError),
        ('slice(["a"], 0, 2)', ValueError),
        ('yamldecode("a: 1\\n---\\nb: 2\\n")', yaml.YAMLError),  # one document only
    ],
)
def test_what_terraform_refuses_or_the_reader_does_not_know_is_an_error(expression, error):
    with pytest.raises(error):
        evaluate(f"locals {{\n  v = {expression}\n}}\n", "v")
