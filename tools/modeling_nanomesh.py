"""
mesh.py's RecursiveGPT (the file beside this one) as a transformers model, for the folder
tools/export_hf.py writes: AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).
The weights keep RecursiveGPT's names, a shared core stored once; generate runs the last
block_size tokens through the model at every step, with no cache.
"""
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .mesh import Config, RecursiveGPT, Rotary


class NanoMeshConfig(PretrainedConfig):
    model_type = "nanomesh"

    def __init__(self, mesh=None, **kwargs):
        self.mesh = mesh or {}  # mesh.Config's fields, as a checkpoint keeps them
        super().__init__(**kwargs)


class NanoMeshForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoMeshConfig

    def __init__(self, config):
        super().__init__(config)
        gpt = RecursiveGPT(Config.from_dict(config.mesh))
        for name, part in gpt.named_children():  # ours, under their own names
            self.add_module(name, part)
        self.__dict__["gpt"] = gpt  # not a part itself: no prefix to the names
        self.post_init()

    def _init_weights(self, module):  # all but the rotary tables come from the file
        if isinstance(module, Rotary):
            fresh = Rotary(self.gpt.config)
            module.cos.copy_(fresh.cos)
            module.sin.copy_(fresh.sin)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        if attention_mask is not None and not attention_mask.all():
            raise ValueError("padding is not supported: give rows of one length")
        logits, _ = self.gpt(input_ids)
        loss = labels if labels is None else self.loss_function(
            logits, labels, logits.size(-1))
        return CausalLMOutput(loss=loss, logits=logits)

    @classmethod
    def _supports_default_dynamic_cache(cls):  # generate(use_cache=True): none made
        return False

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kw):
        L = self.gpt.config.block_size  # as RecursiveGPT.generate: the last L
        mask = attention_mask if attention_mask is None else attention_mask[:, -L:]
        return {"input_ids": input_ids[:, -L:], "attention_mask": mask}
