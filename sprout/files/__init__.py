"""sprout.files: the file formats, apart from the model.

Checkpoints (`load`, `save`: safetensors with the config, torch files read weights-only, run folders,
the shipped demos), the one file contract every reader follows (`regular_file`, `file_in`,
`read_json_file`), the fit check that compares a config with the weights before any module is built,
Hugging Face's Qwen3 folders (`sprout.files.hf`), the walkthrough script's state-dict keys, tokenizer.json,
and the writers that never lose a user's file (`write_folder`, and `replace_file`, the one atomic write).
"""
from . import hf
from .checkpoint import (
                         check_floating,
                         demo_dir,
                         demo_names,
                         from_state_dict,
                         infer_config,
                         is_checkpoint,
                         latest_checkpoint,
                         load,
                         save,
                         warn_non_finite,
)
from .folders import FolderLocked, NotOursError, folder_lock, is_temp_sibling, remove_ours, replace_file, write_bytes, write_folder
from .tokenizer_file import load_tokenizer, save_tokenizer
from .walkthrough_keys import from_walkthrough_state_dict, to_walkthrough_state_dict
from .weightfiles import check_fields, file_in, read_bounded, read_json, read_json_file, regular_file

__all__ = ["FolderLocked", "NotOursError", "folder_lock", "check_fields", "check_floating", "demo_dir", "demo_names", "file_in",
           "from_state_dict", "from_walkthrough_state_dict", "hf", "infer_config", "is_checkpoint", "is_temp_sibling",
           "latest_checkpoint", "load", "load_tokenizer", "read_bounded", "read_json", "read_json_file",
           "regular_file", "remove_ours", "replace_file", "save", "save_tokenizer", "to_walkthrough_state_dict",
           "warn_non_finite", "write_bytes", "write_folder"]
