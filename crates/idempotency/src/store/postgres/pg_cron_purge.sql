  DELETE FROM idempotency
  WHERE expiration < floor(extract(epoch FROM now()))::bigint - 60
    AND (status <> 'INPROGRESS' OR in_progress_expiration IS NULL
         OR in_progress_expiration < floor(extract(epoch FROM now()) * 1000)::bigint - 60000)
