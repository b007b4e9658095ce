"""A bad sampling value gives one message whichever way it comes in: the sampler node, the command line and
`specar.generate` all check it with `check_sampling` (samplers/sampling.py)."""
import pytest

import specar
from specar.cli import main
from support.node_harness import BASE, execute, flavours, node_classes, run_sampler_node

# bad for every model; the node's widgets, the command line's options and generate's sampling each take them
BAD = [("cfg_scale", -1.0), ("cfg_scale", float("nan")), ("temperature", -0.5), ("temperature", float("inf")),
       ("top_k", -3), ("top_p", 0.0), ("top_p", 1.5)]
SWITCH = {"cfg_scale": "guidance", "top_k": "guidance", "temperature": "sampling", "top_p": "sampling"}


def from_node(flavour, name, value) -> str:
    classes = node_classes(flavour)
    model, = execute(classes["SpecARModelLoader"], model="demo", device="auto", dtype="auto")[0]
    with pytest.raises(ValueError) as e:
        run_sampler_node(classes["SpecARSampler"], model, {**BASE, SWITCH[name]: "custom", name: value})
    return str(e.value)


def from_command_line(name, value, capsys) -> str:
    assert main(["bench", f"--{name.replace('_', '-')}={value!r}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.endswith(" (--debug shows the traceback)\n"), err
    return err[len("error: "):-len(" (--debug shows the traceback)\n")]


def from_python(name, value) -> str:
    with pytest.raises(ValueError) as e:
        specar.generate(specar.load_model("demo"), "hi", sampling={name: value})
    return str(e.value)


@pytest.mark.parametrize("flavour", flavours())
@pytest.mark.parametrize("name, value", BAD, ids=[f"{n}={v}" for n, v in BAD])
def test_a_bad_sampling_value_gives_one_message_every_way_in(flavour, name, value, comfy, capsys):
    messages = {"node": from_node(flavour, name, value), "command line": from_command_line(name, value, capsys),
                "python": from_python(name, value)}
    assert len(set(messages.values())) == 1, messages
    assert messages["python"].startswith(f"{name} must be ") and messages["python"].endswith(f"got {value!r}")
