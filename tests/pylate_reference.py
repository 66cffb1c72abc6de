"""Run by support.pylate_reference with PyLate's pinned versions first on the path:
`python pylate_reference.py FOLDER OUT.npz QUERIES_JSON DOCUMENTS_JSON` saves PyLate's float32
vectors of each query (q0, q1, ...) and document (d0, ...) and their MaxSim scores."""

import json
import sys

import numpy as np
import torch
from pylate import models, scores

folder, out, queries, documents = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
model = models.ColBERT(folder, device="cpu")
query_vectors = model.encode(queries, is_query=True, batch_size=4)
document_vectors = model.encode(documents, is_query=False, batch_size=4)
padded = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(d) for d in document_vectors], batch_first=True)
mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(d)) for d in document_vectors], batch_first=True)
maxsim = [scores.colbert_scores(torch.from_numpy(q)[None], padded, documents_mask=mask)[0] for q in query_vectors]
arrays = {f"q{i}": v for i, v in enumerate(query_vectors)} | {f"d{i}": v for i, v in enumerate(document_vectors)}
np.savez(out, scores=torch.stack(maxsim).numpy(), **arrays)
