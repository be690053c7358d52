# Ported from TransformerLens: tests/unit/test_utils.py,
# as released in transformer-lens 3.9.0 (sdist transformer_lens-3.9.0.tar.gz, sha256 671f01075af1107e…;
# this content is in no commit of github.com/TransformerLensOrg/TransformerLens's history on record).
# Only the model under test is substituted (tests/transformer_lens/under_test.py: Forma's HookedTransformer or
# TransformerLens's, over the same tiny checkpoint, tests/transformer_lens/models.py); every test runs on both.
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from tests.transformer_lens.under_test import HookedTransformer  # the model under test
from transformer_lens import utilities as utils

ref_tensor = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
shape = ref_tensor.shape
tensor_row0_dim2 = torch.tensor([[1, 2, 3, 4, 5]])
shape_2 = tensor_row0_dim2.shape
tensor_row0_dim1 = torch.tensor([1, 2, 3, 4, 5])
shape_1 = tensor_row0_dim1.shape


class TestSlice:
    @pytest.mark.parametrize(
        "input_slice, expected_shape",
        [
            (
                [
                    0,
                ],
                shape_2,
            ),
            ((1,), shape_2),
            (
                torch.tensor(
                    [
                        0,
                    ]
                ),
                shape_2,
            ),
            (
                np.array(
                    [
                        0,
                    ]
                ),
                shape_2,
            ),
            (0, shape_1),
            (torch.tensor(0), shape_1),
            (None, shape),
        ],
    )
    def test_modularity_shape(self, input_slice, expected_shape):
        slc = utils.Slice(input_slice=input_slice)
        sliced_tensor = slc.apply(ref_tensor)
        assert sliced_tensor.shape == expected_shape

    @pytest.mark.parametrize(
        "input_slice, expected_tensor",
        [
            (
                [
                    0,
                ],
                tensor_row0_dim2,
            ),
            (
                torch.tensor(
                    [
                        0,
                    ]
                ),
                tensor_row0_dim2,
            ),
            (
                np.array(
                    [
                        0,
                    ]
                ),
                tensor_row0_dim1,
            ),
            (0, tensor_row0_dim1),
            (torch.tensor(0), tensor_row0_dim1),
            (None, ref_tensor),
        ],
    )
    def test_modularity_tensor(self, input_slice, expected_tensor):
        slc = utils.Slice(input_slice=input_slice)
        sliced_tensor = slc.apply(ref_tensor)
        assert (sliced_tensor == expected_tensor).all()

    @pytest.mark.parametrize(
        "input_slice, expected_indices",
        [
            ([0, 1], np.array([0, 1])),
            (0, np.array(0)),
            (torch.tensor(0), np.array(0)),
        ],
    )
    def test_indices(self, input_slice, expected_indices):
        slc = utils.Slice(input_slice=input_slice)
        indices = slc.indices(2)
        assert (indices == expected_indices).all()

    def test_indices_error(self):
        with pytest.raises(ValueError):
            _ = utils.Slice(input_slice=[0, 2, 5]).indices()


class Test_is_square:
    failed_cases = (
        torch.tensor([]),
        torch.tensor(2),
        torch.ones(2, 3),
        torch.zeros(2),
        torch.ones(3, 3, 3),
        torch.ones(1, 1, 1, 1),
    )

    @pytest.mark.parametrize("x", (torch.ones(3, 3), torch.zeros(1, 1)))
    def test_pass(self, x: torch.Tensor):
        assert utils.is_square(x)

    @pytest.mark.parametrize("x", failed_cases)
    def test_fail(self, x: torch.Tensor):
        assert not utils.is_square(x)


class Test_lower_triangular:
    @pytest.mark.parametrize(
        "x",
        (
            torch.eye(4),
            torch.ones(4, 4).tril(),
            torch.ones(4, 4).triu().T,
            torch.zeros(4, 4),
        ),
    )
    def test_pass(self, x: torch.Tensor):
        assert utils.is_lower_triangular(x)

    @pytest.mark.parametrize(
        "x",
        (
            *Test_is_square.failed_cases,
            torch.ones(4, 4).triu(),
            torch.ones(4, 4).tril().T,
            torch.ones(3, 3),
        ),
    )
    def test_fail(self, x: torch.Tensor):
        assert not utils.is_lower_triangular(x)


def test_override_or_use_default_value():
    # Case when override is not None
    assert utils.override_or_use_default_value(default_flag=True, override=True) == True
    assert utils.override_or_use_default_value(default_flag=True, override=False) == False
    assert utils.override_or_use_default_value(default_flag=False, override=True) == True
    assert utils.override_or_use_default_value(default_flag=False, override=False) == False

    # Case when override is None
    assert utils.override_or_use_default_value(default_flag=True, override=None) == True
    assert utils.override_or_use_default_value(default_flag=False, override=None) == False

    # Case when override is not passed
    assert utils.override_or_use_default_value(default_flag=True) == True
    assert utils.override_or_use_default_value(default_flag=False) == False


def test_is_library_available():
    # Checking libraries that are definitely included in dependencies
    assert utils.is_library_available("torch") is True
    assert utils.is_library_available("numpy") is True

    # Check the standard library (sys is always loaded)
    assert utils.is_library_available("sys") is True

    # Checking a library that obviously doesn't exist
    assert utils.is_library_available("completely_fake_library_name_123") is False


class TestAttentionMask:
    prompts = [
        "Hello world!",
        "How are you today?",
        "I'm fine, thank you.",
        "I am happy.",
    ]

    prompts_with_sep = [
        "I like cats<|endoftext|>Cats are so cute",
        "Hello world!",
        "How are you<|endoftext|>I am fine, thanks",
    ]

    # fixtures
    @pytest.fixture(scope="class", params=["gpt2-small", "facebook/opt-125m"])
    def model_name(self, request):
        return request.param

    @pytest.fixture(scope="class")
    def model(self, model_name):
        return HookedTransformer.from_pretrained(model_name)

    # tests
    @pytest.mark.parametrize("padding_side", ["left", "right"])
    @pytest.mark.parametrize("prepend_bos", [True, False])
    @pytest.mark.parametrize("prompts_with_sep", [True, False])
    def test_get_attention_mask(self, model, padding_side, prepend_bos, prompts_with_sep):
        # setup
        model.tokenizer.padding_side = padding_side
        model.tokenizer.sep_token_id = model.tokenizer.pad_token_id
        prepend_bos = prepend_bos

        prompts = self.prompts_with_sep if prompts_with_sep else self.prompts
        tokens = model.to_tokens(prompts, prepend_bos=prepend_bos)

        attention_mask = utils.get_attention_mask(
            model.tokenizer, tokens, prepend_bos=prepend_bos
        )  # [batch pos]

        # dimension should be the same
        assert attention_mask.shape == tokens.shape

        # number of attended tokens for each sequence
        # should be the same as the number of 1s in the attention mask for that sequence
        str_tokens = model.to_str_tokens(prompts, prepend_bos=prepend_bos)
        intended_num_attended_tokens = torch.tensor(
            [len(t) for t in str_tokens], device=attention_mask.device
        )
        assert (intended_num_attended_tokens == attention_mask.sum(dim=1)).all()

        # all the masked tokens should be the padding token
        assert (tokens[attention_mask == 0] == model.tokenizer.pad_token_id).all()

        if padding_side == "right":
            # the first token is always attended
            assert (attention_mask[:, 0] == 1).all()

            # attended tokens are at the beginning of the sequence
            for i, num in enumerate(intended_num_attended_tokens.tolist()):
                assert (attention_mask[i, 0:num] == 1).all()

        else:  # left padding case
            # the last token is always attended
            assert (attention_mask[:, -1] == 1).all()

            # attended tokens are at the end of the sequence
            for i, num in enumerate(intended_num_attended_tokens.tolist()):
                assert (attention_mask[i, -num:] == 1).all()

        # the following tests make sense only when the prompts do not contain the separator token
        if not prompts_with_sep:
            non_pad_token_mask = (tokens != model.tokenizer.pad_token_id).int()
            attended_but_non_pad_mask = attention_mask != non_pad_token_mask
            if model.tokenizer.bos_token == model.tokenizer.pad_token and prepend_bos:
                # if bos_token is the same as pad_token and prepend_bos is True,
                # then there is one attended but non-pad token (bos token) in each sequence
                assert attended_but_non_pad_mask.sum() == tokens.shape[0]
            else:
                # otherwise, there should be no attended but non-pad token
                assert attended_but_non_pad_mask.sum() == 0


def test_calc_fan_in_fan_out():
    """
    Test for the calc_fan_in_and_fan_out function in the utils module.
    """
    # Test for the case when the tensor is 1D
    tensor_1d = torch.tensor([1, 2, 3, 4, 5])
    fan_in, fan_out = utils.calc_fan_in_and_fan_out(tensor_1d)
    assert fan_in == 1
    assert fan_out == 5

    # Test for the case when the tensor is 2D
    tensor_2d = torch.tensor([[1, 2, 3], [4, 5, 6]])
    fan_in, fan_out = utils.calc_fan_in_and_fan_out(tensor_2d)
    assert fan_in == 2
    assert fan_out == 3

    # Test for the case when the tensor is 3D
    tensor_3d = nn.Parameter(torch.rand(2, 25, 5))
    fan_in, fan_out = utils.calc_fan_in_and_fan_out(tensor_3d)
    assert fan_in == 25
    assert fan_out == 10

    # Test for the case when the tensor is 4D (should raise a ValueError)
    tensor_4d = torch.tensor([[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]])
    with pytest.raises(ValueError):
        fan_in, fan_out = utils.calc_fan_in_and_fan_out(tensor_4d)

    # Test for the case when the tensor is 0D (also should raise a ValueError)
    tensor_0d = torch.tensor(1)
    with pytest.raises(ValueError):
        fan_in, fan_out = utils.calc_fan_in_and_fan_out(tensor_0d)


class TestInitKaiming:
    """Test cases for kaiming init."""

    @pytest.mark.parametrize(
        "d_model", [4096, 10_000]
    )  # this needs to be large so std and min/max estimates are accurate
    @pytest.mark.parametrize("d_mlp", [256, 512])
    @pytest.mark.parametrize("nonlinearity", ["linear", "relu"])
    def test_init_kaiming_uniform(self, d_model, d_mlp, nonlinearity):
        """
        Test init_kaiming_uniform function in the utils module on 3/2/1D tensors.
        """
        torch.manual_seed(1234)

        gain = np.sqrt(2.0) if nonlinearity == "relu" else 1.0

        x = nn.Parameter(torch.empty(2, d_model, 137))  # n_head and d_head don't matter
        utils.init_kaiming_uniform_(x, nonlinearity=nonlinearity)
        std = gain / np.sqrt(d_model)
        assert np.isclose(x.std().detach().numpy(), std, rtol=1e-2)
        # for uniform distributions, min/max is sqrt(3) times the std
        assert np.isclose(x.max().detach().numpy(), np.sqrt(3) * std, rtol=1e-2)
        assert np.isclose(x.min().detach().numpy(), -np.sqrt(3) * std, rtol=1e-2)

        y = nn.Parameter(torch.empty(d_mlp, d_model))
        utils.init_kaiming_uniform_(y, nonlinearity=nonlinearity)
        std = gain / np.sqrt(d_mlp)
        assert np.isclose(y.std().detach().numpy(), std, rtol=1e-2)
        # for uniform distributions, min/max is sqrt(3) times the std
        assert np.isclose(y.max().detach().numpy(), np.sqrt(3) * std, rtol=1e-2)
        assert np.isclose(y.min().detach().numpy(), -np.sqrt(3) * std, rtol=1e-2)

        z = nn.Parameter(torch.empty(d_model * 123))
        utils.init_kaiming_uniform_(z, nonlinearity=nonlinearity)
        std = gain  # bias has fan_in 1
        assert np.isclose(z.std().detach().numpy(), std, rtol=1e-2)
        # for uniform distributions, min/max is sqrt(3) times the std
        assert np.isclose(z.max().detach().numpy(), np.sqrt(3) * std, rtol=1e-2)
        assert np.isclose(z.min().detach().numpy(), -np.sqrt(3) * std, rtol=1e-2)

        torch.manual_seed(1234)
        x_new = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_kaiming_uniform_(x_new, nonlinearity=nonlinearity)
        assert torch.allclose(x_new, x, rtol=1e-2)

    @pytest.mark.parametrize("d_model", [4096, 10_000])
    @pytest.mark.parametrize("d_mlp", [256, 512])
    @pytest.mark.parametrize("nonlinearity", ["linear", "relu"])
    def test_init_kaiming_normal(self, d_model, d_mlp, nonlinearity):
        """
        Test init_kaiming_normal function in the utils module on 3/2/1D tensors.
        """
        torch.manual_seed(1234)

        gain = np.sqrt(2.0) if nonlinearity == "relu" else 1.0

        x = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_kaiming_normal_(x, nonlinearity=nonlinearity)
        std = gain / np.sqrt(d_model)
        assert np.isclose(x.std().detach().numpy(), std, rtol=1e-2)

        y = nn.Parameter(torch.empty(d_mlp, d_model))
        utils.init_kaiming_normal_(y, nonlinearity=nonlinearity)
        std = gain / np.sqrt(d_mlp)
        assert np.isclose(y.std().detach().numpy(), std, rtol=1e-2)

        z = nn.Parameter(torch.empty(d_model * 123))
        utils.init_kaiming_normal_(z, nonlinearity=nonlinearity)
        std = gain  # bias has fan_in 1
        assert np.isclose(z.std().detach().numpy(), std, rtol=1e-2)

        torch.manual_seed(1234)
        x_new = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_kaiming_normal_(x_new, nonlinearity=nonlinearity)
        assert torch.allclose(x_new, x, rtol=1e-2)


class TestInitXavier:
    """Test cases for Xavier init. Std of distribution should be scaled to sqrt(2/(fan_in + fan_out))."""

    @pytest.mark.parametrize("d_model", [4096, 10_000])
    @pytest.mark.parametrize("d_mlp", [256, 512])
    def test_init_xavier_uniform(self, d_model, d_mlp):
        """Test init_xavier_uniform function in the utils module on 3/2/1D tensors."""
        torch.manual_seed(1234)

        x = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_xavier_uniform_(x)
        std = np.sqrt(2 / (d_model + 137 * 2))
        assert np.isclose(x.std().detach().numpy(), std, rtol=1e-2)
        # for uniform distributions, min/max is sqrt(3) times the std
        assert np.isclose(x.max().detach().numpy(), np.sqrt(3) * std, rtol=1e-2)
        assert np.isclose(x.min().detach().numpy(), -np.sqrt(3) * std, rtol=1e-2)

        y = nn.Parameter(torch.empty(d_mlp, d_model))
        utils.init_xavier_uniform_(y)
        std = np.sqrt(2 / (d_mlp + d_model))
        assert np.isclose(y.std().detach().numpy(), std, rtol=1e-2)
        # for uniform distributions, min/max is sqrt(3) times the std
        assert np.isclose(y.max().detach().numpy(), np.sqrt(3) * std, rtol=1e-2)
        assert np.isclose(y.min().detach().numpy(), -np.sqrt(3) * std, rtol=1e-2)

        z = nn.Parameter(torch.empty(d_model * 123))
        utils.init_xavier_uniform_(z)
        std = np.sqrt(2 / (1 + d_model * 123))
        assert np.isclose(z.std().detach().numpy(), std, rtol=1e-2)
        # for uniform distributions, min/max is sqrt(3) times the std
        assert np.isclose(z.max().detach().numpy(), np.sqrt(3) * std, rtol=1e-2)
        assert np.isclose(z.min().detach().numpy(), -np.sqrt(3) * std, rtol=1e-2)

        torch.manual_seed(1234)
        x_new = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_xavier_uniform_(x_new)
        assert torch.allclose(x_new, x, rtol=1e-2)

    @pytest.mark.parametrize("d_model", [4096, 10_000])
    @pytest.mark.parametrize("d_mlp", [256, 512])
    def test_init_xavier_normal(self, d_model, d_mlp):
        """Test init_xavier_normal function in the utils module on 3/2/1D tensors."""
        torch.manual_seed(1234)

        x = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_xavier_normal_(x)
        std = np.sqrt(2 / (d_model + 137 * 2))
        assert np.isclose(x.std().detach().numpy(), std, rtol=1e-2)

        y = nn.Parameter(torch.empty(d_mlp, d_model))
        utils.init_xavier_normal_(y)
        std = np.sqrt(2 / (d_mlp + d_model))
        assert np.isclose(y.std().detach().numpy(), std, rtol=1e-2)

        z = nn.Parameter(torch.empty(d_model * 123))  # need to make this larger so std is accurate
        utils.init_xavier_normal_(z)
        std = np.sqrt(2 / (1 + d_model * 123))
        assert np.isclose(z.std().detach().numpy(), std, rtol=1e-2)

        torch.manual_seed(1234)
        x_new = nn.Parameter(torch.empty(2, d_model, 137))
        utils.init_xavier_normal_(x_new)
        assert torch.allclose(x_new, x, rtol=1e-2)


class TestTokenizeAndConcatenate:
    """Tests for tokenize_and_concatenate utility function."""

    def test_no_split_tokens_across_chunks(self):
        """
        Regression test for issue #1133.
        tokenize_and_concatenate previously split text into chunks by character
        count, which could cut words in half and produce token pairs that would
        never occur in naturally tokenized text. This test verifies that all
        tokens in the output also appear consecutively in a clean tokenization
        of the same text, confirming no artificial token pairs were introduced.
        """
        from datasets import Dataset
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained("gpt2")

        # Construct text where character-based splitting would cut mid-word.
        # Repeating a long word many times ensures a chunk boundary falls inside it.
        text = "Military " * 500
        dataset = Dataset.from_dict({"text": [text]})

        result = utils.tokenize_and_concatenate(
            dataset,
            tokenizer,
            streaming=False,
            max_length=64,
            add_bos_token=False,
            # Chunk boundaries are what's under test; any num_proc makes datasets
            # fork a dill-pickling pool that chokes on pytest's captured stdout.
            num_proc=None,
        )

        # Tokenize the same text cleanly in one shot (no chunking)
        clean_tokens = tokenizer(text, return_tensors="np")["input_ids"].flatten()

        # Build a set of all consecutive pairs from the clean tokenization
        clean_pairs = set(zip(clean_tokens[:-1], clean_tokens[1:]))

        # Every consecutive pair in our output must exist in the clean pairs
        output_tokens = np.array(result["tokens"]).flatten()
        for i in range(len(output_tokens) - 1):
            pair = (output_tokens[i], output_tokens[i + 1])
            assert pair in clean_pairs, (
                f"Token pair {pair} found in tokenize_and_concatenate output "
                f"but never occurs in natural tokenization. "
                f"This indicates a word was split across chunk boundaries."
            )

    def test_no_split_tokens_in_no_whitespace_text(self):
        """No-whitespace multi-doc input — the prior whitespace-lookahead fix
        fell through to character cuts here. streaming=True keeps all docs in
        one tokenize_function call so EOS markers actually exist to split on.
        """
        from datasets import Dataset
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained("gpt2")

        docs = ["a" * 200 + "MilitaryVehicleEngine" * 100] * 10
        dataset = Dataset.from_dict({"text": docs})

        result = utils.tokenize_and_concatenate(
            dataset,
            tokenizer,
            streaming=True,
            max_length=128,
            add_bos_token=False,
        )

        full_text = tokenizer.eos_token.join(docs)
        clean_tokens = tokenizer(full_text, return_tensors="np")["input_ids"].flatten()
        clean_pairs = set(zip(clean_tokens[:-1], clean_tokens[1:]))

        output_tokens = np.concatenate([np.array(row["tokens"]) for row in result])
        for i in range(len(output_tokens) - 1):
            pair = (int(output_tokens[i]), int(output_tokens[i + 1]))
            assert pair in clean_pairs, (
                f"Token pair {pair} appears in tokenize_and_concatenate output "
                f"but never occurs in natural tokenization. The chunker must "
                f"have cut a token in half."
            )

    def test_single_document_batch_does_not_crash(self):
        """Single-doc batch has no EOS to split on — fallback to one chunk should be correct."""
        from datasets import Dataset
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained("gpt2")
        dataset = Dataset.from_dict({"text": ["abcdefghij" * 200]})

        result = utils.tokenize_and_concatenate(
            dataset,
            tokenizer,
            streaming=True,
            max_length=64,
            add_bos_token=False,
        )

        clean = tokenizer("abcdefghij" * 200, return_tensors="np")["input_ids"].flatten()
        output = np.concatenate([np.array(row["tokens"]) for row in result])
        n = len(output)
        assert (output == clean[:n]).all()

    def test_iterable_dataset_with_set_format_false(self, gpt2_tokenizer):
        """``IterableDataset`` input + ``set_format=False`` returns a usable iterable.

        Regression test for the path requested in #473: ``set_format(type="torch")``
        is unsupported on iterable datasets, so callers streaming a corpus must be
        able to opt out of that final step.
        """
        from datasets import Dataset
        from datasets.iterable_dataset import IterableDataset

        tokenizer = gpt2_tokenizer
        source = Dataset.from_dict({"text": ["hello world"] * 4})
        iterable = source.to_iterable_dataset()
        assert isinstance(iterable, IterableDataset)

        result = utils.tokenize_and_concatenate(
            iterable,
            tokenizer,
            streaming=True,
            max_length=8,
            add_bos_token=False,
            set_format=False,
        )

        # Result is iterable and yields token rows of the requested length.
        rows = list(result)
        assert len(rows) > 0
        for row in rows:
            assert "tokens" in row
            assert len(row["tokens"]) == 8


def test_tokenize_and_concatenate_no_spurious_sequence_length_warning():
    """Test that tokenize_and_concatenate does not emit the HF 'sequence length longer than maximum' warning."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    # Use a tokenizer with model_max_length and EOS
    tokenizer = AutoTokenizer.from_pretrained("t5-small")
    assert tokenizer.model_max_length == 512
    assert tokenizer.eos_token is not None

    # Long text so that when split into 20 chunks, at least one chunk tokenizes to > 512 tokens
    long_text = "word " * 20000
    dataset = Dataset.from_dict({"text": [long_text]})

    with warnings.catch_warnings(record=True) as recorded:
        warnings.simplefilter("always")
        result = utils.tokenize_and_concatenate(
            dataset,
            tokenizer,
            max_length=tokenizer.model_max_length,
            add_bos_token=False,
            streaming=True,
        )

    # No warning about sequence length exceeding model maximum
    for w in recorded:
        msg = str(w.message)
        assert (
            "longer than the specified maximum" not in msg
        ), f"tokenize_and_concatenate should not emit sequence-length warning; got: {msg}"

    # Sanity: output has expected shape (batch, max_length); result is a Dataset
    assert len(result) >= 1
    first_row = result[0]["tokens"]
    assert first_row.shape[0] == tokenizer.model_max_length
    assert first_row.dim() == 1


def test_tokenize_and_concatenate_short_sequence_no_invalid_tokens():
    """When the tokenizer has no pad token, output should only contain token IDs in the model's vocab."""
    # Fresh tokenizer (not gpt2_tokenizer fixture): the function mutates pad_token
    # and we assert pad_token is None at the start.
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained("gpt2")
    assert tokenizer.pad_token is None, "GPT-2 has no pad token"
    original_vocab_size = tokenizer.vocab_size

    dataset = Dataset.from_dict({"text": ["Hello", "world", "today"]})
    result = utils.tokenize_and_concatenate(
        dataset,
        tokenizer,
        column_name="text",
        add_bos_token=True,
        streaming=True,
    )
    tokens = result[0]["tokens"]
    assert tokens.min().item() >= 0
    assert tokens.max().item() < original_vocab_size, (
        "Returned tensor contained invalid token ID (e.g. synthetic pad). "
        "All IDs must be < original tokenizer vocab size."
    )
