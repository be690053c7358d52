"""The one error type the model raises for a call TransformerLens refuses with an assertion."""


class Misuse(ValueError, AssertionError):
    """A call the model cannot answer as asked (text without a tokenizer, a string that is not one token, a hook
    on a switched-off hook point, ...). A ValueError, as every other bad argument in Forma, and an AssertionError,
    which is what TransformerLens raises for the same call, so that code written for TransformerLens that
    catches it catches this too."""


class HookSwitchedOff(Misuse, KeyError):
    """A hook on a hook point that exists only while its switch is on (attn.hook_result: use_attn_result, ...).
    Also a KeyError, as for any name the model does not have now."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
