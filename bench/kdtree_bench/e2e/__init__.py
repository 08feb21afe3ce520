"""The end-to-end harness: real SGLang servers, their speed runs and the parity gate on them."""
