"""Draft heads for the in-process engine: small networks on the target model's last
hidden state that propose a tree of next tokens, verified by the target in one pass.

`model` holds the head networks (independent, Medusa-style, and causally dependent,
Hydra-style) and their files; `tree` drafts a candidate tree and verifies it;
`decode` is the decoding loop the transformers engine runs for `method = "draft_heads"`;
`data` and `train` build the heads by self-distillation (`canaryd models train-heads`).
"""
