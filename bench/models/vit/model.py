"""A small vision transformer, written the way torchvision's ViT writes one: a Conv2d patch
embedding, a class token, learned position embeddings, pre-LN encoder blocks with
nn.MultiheadAttention, and a linear head on the class token."""

import torch
import torch.nn as nn


class EncoderBlock(nn.Module):
    def __init__(self, width, heads, mlp_ratio=4):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width),
            nn.GELU(),
            nn.Linear(mlp_ratio * width, width),
        )

    def forward(self, x):
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class VisionTransformer(nn.Module):
    def __init__(self, image_size=32, patch_size=4, num_classes=10, width=192, heads=3, depth=4):
        super().__init__()
        self.patch_size = patch_size
        self.conv_proj = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size)
        num_patches = (image_size // patch_size) ** 2
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embedding = nn.Parameter(torch.empty(1, num_patches + 1, width).normal_(std=0.02))
        self.layers = nn.Sequential(*[EncoderBlock(width, heads) for _ in range(depth)])
        self.ln = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, num_classes)

    def forward(self, images):
        x = self.conv_proj(images)  # (n, width, h/p, w/p)
        x = x.flatten(2).transpose(1, 2)  # (n, patches, width)
        cls = self.class_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embedding
        x = self.ln(self.layers(x))
        return self.head(x[:, 0])
